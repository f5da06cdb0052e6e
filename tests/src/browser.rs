//! A real headless Chromium for tests that look at pages (`mst report`'s file, `mst serve`'s
//! UI): Debian's `/usr/bin/chromium` driven through `/usr/bin/chromedriver` with WebDriver
//! ([fantoccini]), behind a small blocking API so that plain `#[test]` functions can use it.
//!
//! Each [`Browser`] has its own chromedriver on a free loopback port, its own Chromium profile
//! in a temporary directory, and its own output directory for screenshots
//! ([`crate::test_output_dir`]). Dropping it ends the session and kills chromedriver's whole
//! process group, Chromium included.
//!
//! When Chromium or chromedriver is missing, [`Browser::try_start`] skips (prints a note and
//! returns `None`) unless `MST_REQUIRE_BROWSER` is set, as `cargo xtask test` sets it; then it
//! fails, naming the packages to install, as [`Browser::start`] always does.

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's Chromium (package `chromium`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Debian's chromedriver (package `chromium-driver`), of the same version as [`CHROMIUM`].
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long [`Browser::wait_for`] waits unless told otherwise.
const WAIT: Duration = Duration::from_secs(10);

/// Whether Chromium and chromedriver exist here; panics when they must (`MST_REQUIRE_BROWSER`
/// is set, by `cargo xtask test`) and do not.
pub fn available() -> bool {
    let present = Path::new(CHROMIUM).is_file() && Path::new(CHROMEDRIVER).is_file();
    if !present && std::env::var_os("MST_REQUIRE_BROWSER").is_some() {
        panic!(
            "MST_REQUIRE_BROWSER is set but {CHROMIUM} or {CHROMEDRIVER} is missing \
             (apt-get install chromium chromium-driver)"
        );
    }
    present
}

/// Chromium's switches. Without the background-networking ones Chromium opens connections of
/// its own (updates, sync, field trials), many at a time, that a closed network refuses.
fn chromium_args(profile: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,900",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain(std::iter::once(format!(
        "--user-data-dir={}",
        crate::s(profile)
    )))
    .collect()
}

/// chromedriver's log endpoint (not in the W3C protocol): the browser's console messages since
/// the last read, with `goog:loggingPrefs` {"browser": "ALL"} in the session's capabilities.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.into()))
    }
}

/// A Chrome DevTools Protocol command through chromedriver's `goog/cdp/execute` endpoint, for
/// what WebDriver has no command for.
#[derive(Debug)]
struct Cdp {
    command: &'static str,
    params: serde_json::Value,
}

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!(
            "session/{}/goog/cdp/execute",
            session.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        let body = serde_json::json!({"cmd": self.command, "params": self.params});
        (http::Method::POST, Some(body.to_string()))
    }
}

/// A headless Chromium session. Every method panics with what it was doing when the browser
/// fails, as a test should.
pub struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    driver: Child,
    profile: tempfile::TempDir,
    output: PathBuf,
}

impl Browser {
    /// Starts a browser whose screenshots go to [`crate::test_output_dir`]; panics when Chromium is
    /// missing (see [`Browser::try_start`] to skip instead).
    pub fn start() -> Browser {
        Browser::start_with_output(crate::test_output_dir())
    }

    /// [`Browser::start`], or `None` with a note on stderr when Chromium or chromedriver is
    /// missing and `MST_REQUIRE_BROWSER` is unset.
    pub fn try_start() -> Option<Browser> {
        if available() {
            Some(Browser::start())
        } else {
            eprintln!(
                "skipped: {CHROMIUM} or {CHROMEDRIVER} is missing \
                 (apt-get install chromium chromium-driver)"
            );
            None
        }
    }

    /// Starts a browser whose screenshots go to `output`.
    pub fn start_with_output(output: PathBuf) -> Browser {
        assert!(
            Path::new(CHROMIUM).is_file() && Path::new(CHROMEDRIVER).is_file(),
            "{CHROMIUM} or {CHROMEDRIVER} is missing: apt-get install chromium chromium-driver"
        );
        std::fs::create_dir_all(&output).unwrap_or_else(|e| panic!("{}: {e}", output.display()));
        let port = crate::free_port();
        let mut command = Command::new(CHROMEDRIVER);
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that Drop kills chromedriver and every Chromium
            // process with one signal.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal,
        // so that chromedriver (and with it Chromium) dies with a test process killed outright.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let driver = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let profile = tempfile::tempdir().expect("temp dir");
        let mut browser = Browser {
            runtime,
            client: None,
            driver,
            profile,
            output,
        };
        crate::wait_for_port(port, "chromedriver");
        let capabilities = serde_json::json!({
            "goog:chromeOptions": {"binary": CHROMIUM, "args": chromium_args(browser.profile.path())},
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!("an object")
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = browser
            .runtime
            .block_on(
                ClientBuilder::new(connector)
                    .capabilities(capabilities)
                    .connect(&format!("http://127.0.0.1:{port}")),
            )
            .unwrap_or_else(|e| panic!("cannot open a Chromium session through chromedriver: {e}"));
        browser.client = Some(client);
        browser
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a session")
    }

    /// Where [`Browser::screenshot`] writes.
    pub fn output_dir(&self) -> &Path {
        &self.output
    }

    /// The Chromium profile directory (its `--user-data-dir`), unique to this browser.
    pub fn profile_dir(&self) -> &Path {
        self.profile.path()
    }

    /// chromedriver's process id (its process group's too).
    pub fn driver_pid(&self) -> u32 {
        self.driver.id()
    }

    /// Opens `url` (`http://…` or `file://…`) and waits for its load event.
    pub fn goto(&self, url: &str) {
        self.runtime
            .block_on(self.client().goto(url))
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    /// The page's visible text, cut to `limit` characters: for failure messages.
    pub fn page_text(&self, limit: usize) -> String {
        let text = self
            .runtime
            .block_on(self.client().execute(
                "return document.body ? document.body.innerText : document.documentElement.outerHTML",
                vec![],
            ))
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|e| format!("(cannot read the page: {e})"));
        text.chars().take(limit).collect()
    }

    /// Waits up to 10 s until an element matching `css` is present and visible.
    pub fn wait_for(&self, css: &str) {
        self.wait_for_within(css, WAIT)
    }

    /// Waits up to `limit` until an element matching `css` is present and visible; fails naming
    /// the selector, with the start of the page's text.
    pub fn wait_for_within(&self, css: &str, limit: Duration) {
        let started = Instant::now();
        loop {
            let visible = self.runtime.block_on(async {
                for element in self.client().find_all(Locator::Css(css)).await? {
                    if element.is_displayed().await? {
                        return Ok::<bool, fantoccini::error::CmdError>(true);
                    }
                }
                Ok(false)
            });
            match visible {
                Ok(true) => return,
                Ok(false) => {}
                // Gone while looked at (the page re-rendered): look again.
                Err(e) if e.is_stale_element_reference() => {}
                Err(e) => panic!("waiting for `{css}`: {e}"),
            }
            assert!(
                started.elapsed() < limit,
                "no visible element matches `{css}` after {limit:?}; the page says:\n{}",
                self.page_text(1000)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.runtime
            .block_on(self.client().find(Locator::Css(css)))
            .unwrap_or_else(|e| {
                panic!(
                    "no element matches `{css}` ({e}); the page says:\n{}",
                    self.page_text(1000)
                )
            })
    }

    /// The rendered text of the first element matching `css`.
    pub fn text(&self, css: &str) -> String {
        let element = self.find(css);
        self.runtime
            .block_on(element.text())
            .unwrap_or_else(|e| panic!("text of `{css}`: {e}"))
    }

    /// The rendered text of every element matching `css`, in document order. A page that
    /// redraws the list between the find and the reads (a live view polling) leaves stale
    /// references: the read is made again, a few times.
    pub fn texts(&self, css: &str) -> Vec<String> {
        let read = || {
            self.runtime.block_on(async {
                let mut texts = Vec::new();
                for element in self.client().find_all(Locator::Css(css)).await? {
                    texts.push(element.text().await?);
                }
                Ok::<_, fantoccini::error::CmdError>(texts)
            })
        };
        let mut attempt = 0;
        loop {
            match read() {
                Ok(texts) => return texts,
                Err(e) if attempt < 5 && e.to_string().contains("stale element") => attempt += 1,
                Err(e) => panic!("texts of `{css}`: {e}"),
            }
        }
    }

    /// Attribute `name` of the first element matching `css` (`None` when it has none).
    pub fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.find(css);
        // Read in one script: a page that redraws the element between a find and a read
        // (the playground's session line, after each task) leaves no stale reference.
        let script = format!(
            "var e = document.querySelector({}); return e ? e.getAttribute({}) : null",
            serde_json::json!(css),
            serde_json::json!(name)
        );
        self.eval(&script).as_str().map(str::to_string)
    }

    /// Clicks the first element matching `css`.
    pub fn click(&self, css: &str) {
        let element = self.find(css);
        self.runtime
            .block_on(element.click())
            .unwrap_or_else(|e| panic!("clicking `{css}`: {e}"));
    }

    /// Replaces the value of the input matching `css` with `text`, typed as a person would.
    pub fn fill(&self, css: &str, text: &str) {
        let element = self.find(css);
        self.runtime
            .block_on(async {
                element.clear().await?;
                element.send_keys(text).await
            })
            .unwrap_or_else(|e| panic!("typing into `{css}`: {e}"));
    }

    /// Presses Enter in the element matching `css`.
    pub fn press_enter(&self, css: &str) {
        let element = self.find(css);
        let enter = fantoccini::key::Key::Enter.to_string();
        self.runtime
            .block_on(element.send_keys(&enter))
            .unwrap_or_else(|e| panic!("pressing Enter in `{css}`: {e}"));
    }

    /// Runs `js` in the page as a function body (`return` what you want back) and gives back
    /// its result.
    pub fn eval(&self, js: &str) -> serde_json::Value {
        self.runtime
            .block_on(self.client().execute(js, vec![]))
            .unwrap_or_else(|e| panic!("running script {js:?}: {e}"))
    }

    /// Runs `js` in every page opened from now on, before the page's own scripts: to observe
    /// what a page does while it loads (a timing, a first render).
    pub fn on_new_document(&self, js: &str) {
        let command = Cdp {
            command: "Page.addScriptToEvaluateOnNewDocument",
            params: serde_json::json!({"source": js}),
        };
        self.runtime
            .block_on(self.client().issue_cmd(command))
            .unwrap_or_else(|e| panic!("adding a script to every new document: {e}"));
    }

    /// Resizes the window (CSS pixels of the outer window).
    pub fn set_window_size(&self, width: u32, height: u32) {
        self.runtime
            .block_on(self.client().set_window_size(width, height))
            .unwrap_or_else(|e| panic!("resizing the window to {width}x{height}: {e}"));
    }

    /// Saves a PNG of the viewport as `<output dir>/<name>.png` and returns its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let png = self
            .runtime
            .block_on(self.client().screenshot())
            .unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        let path = self.output.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// The console's errors (level SEVERE: uncaught exceptions, `console.error`, failed loads)
    /// since the last call, each as chromedriver words it.
    pub fn console_errors(&self) -> Vec<String> {
        let log = self
            .runtime
            .block_on(self.client().issue_cmd(BrowserLog))
            .unwrap_or_else(|e| panic!("reading the browser's console log: {e}"));
        log.as_array()
            .into_iter()
            .flatten()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| entry["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Ends the session, which quits Chromium; bounded, since the kill below ends
            // everything anyway.
            let _ = self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), client.close()).await
            });
        }
        // SAFETY: kill with the negated id signals the process group chromedriver leads.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}
