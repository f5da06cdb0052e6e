//! The headless-Chromium harness (`mst_tests::browser`) on real pages: one served over HTTP from
//! a loopback listener, one opened as a file, with a real Chromium through chromedriver.

use mst_tests::browser::Browser;
use std::io::{Read, Write};
use std::path::Path;

/// A page whose button changes a heading's text, whose input echoes what is typed and entered,
/// and which reports its state in `data-state`.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title></head>
<body data-state="new">
<h1 id="title">before</h1>
<button id="go" onclick="document.getElementById('title').textContent = 'after'; document.body.dataset.state = 'clicked'">Go</button>
<input id="name" onkeydown="if (event.key === 'Enter') { document.getElementById('echo').textContent = 'hello ' + this.value }">
<p id="echo"></p>
<ul><li class="row">one</li><li class="row">two</li><li class="row">three</li></ul>
<p id="late" style="display:none">shown late</p>
<script>setTimeout(() => { document.getElementById('late').style.display = 'block' }, 300)</script>
</body></html>"#;

/// Serves `html` to every request on a loopback port from a thread; returns the page's URL.
fn serve(html: &'static str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            // One read takes the whole request line and headers of a GET.
            let mut request = [0u8; 8192];
            let _ = stream.read(&mut request);
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    url
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[test]
fn a_served_page_is_clicked_typed_into_read_and_photographed() {
    let Some(browser) = Browser::try_start() else {
        return;
    };
    browser.goto(&serve(PAGE));
    browser.wait_for("#go");
    assert_eq!(browser.text("#title"), "before");
    assert_eq!(browser.attr("body", "data-state").as_deref(), Some("new"));

    browser.click("#go");
    assert_eq!(browser.text("#title"), "after");
    assert_eq!(
        browser.attr("body", "data-state").as_deref(),
        Some("clicked")
    );
    assert_eq!(browser.attr("#go", "data-missing"), None);

    browser.fill("#name", "world");
    browser.press_enter("#name");
    assert_eq!(browser.text("#echo"), "hello world");

    assert_eq!(browser.texts(".row"), ["one", "two", "three"]);
    // Present from the start but hidden: wait_for waits until it shows.
    browser.wait_for("#late");
    assert_eq!(browser.text("#late"), "shown late");

    assert_eq!(
        browser.eval("return [document.title, 2 + 3]"),
        serde_json::json!(["harness", 5])
    );
    browser.set_window_size(800, 600);
    assert_eq!(browser.eval("return window.outerWidth"), 800);

    let shot = browser.screenshot("page");
    assert_eq!(
        shot,
        mst_tests::target_dir()
            .join("test-output/browser.a_served_page_is_clicked_typed_into_read_and_photographed/page.png")
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG: {shot:?}");
    assert!(browser.console_errors().is_empty());
}

#[test]
fn a_file_page_opens_with_a_script_run_before_its_own_and_its_console_errors_are_read() {
    let Some(browser) = Browser::try_start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("page.html");
    std::fs::write(
        &page,
        r#"<!doctype html><body><p id="msg">from a file</p>
        <script>document.body.dataset.probe = window.mstProbe; console.error('mst-canary-console'); document.body.dataset.ready = '1'; undefinedFunction()</script></body>"#,
    )
    .unwrap();
    // Runs before the page's own script, which reads what it set.
    browser.on_new_document("window.mstProbe = 'set before the page'");
    browser.goto(&format!("file://{}", page.display()));
    browser.wait_for("#msg");
    assert_eq!(browser.text("#msg"), "from a file");
    assert_eq!(browser.eval("return document.body.dataset.ready"), "1");
    assert_eq!(
        browser.attr("body", "data-probe").as_deref(),
        Some("set before the page")
    );
    let errors = browser.console_errors();
    assert!(
        errors.iter().any(|e| e.contains("mst-canary-console")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("undefinedFunction")),
        "{errors:?}"
    );
    // Read once: the log starts over.
    assert!(browser.console_errors().is_empty());
}

#[test]
fn a_wait_that_runs_out_names_the_selector_and_quotes_the_page_and_a_bad_selector_fails_at_once() {
    let Some(browser) = Browser::try_start() else {
        return;
    };
    browser.goto(&serve(PAGE));
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        browser.wait_for_within("#nowhere", std::time::Duration::from_millis(300))
    }))
    .expect_err("waiting for a missing element fails");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("`#nowhere`"), "{message}");
    assert!(message.contains("before"), "{message}");

    // A selector that is not CSS fails at once, as itself, not as a wait that ran out.
    let started = std::time::Instant::now();
    let failed =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| browser.wait_for("#go[")))
            .expect_err("an invalid selector fails");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("invalid selector"), "{message}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn dropping_the_browser_leaves_no_process() {
    let Some(browser) = Browser::try_start() else {
        return;
    };
    browser.goto(&serve(PAGE));
    browser.wait_for("#go");
    let profile = browser.profile_dir().to_str().unwrap().to_string();
    let driver = browser.driver_pid();
    assert!(
        !processes_mentioning(&profile).is_empty(),
        "Chromium runs with its own profile"
    );
    drop(browser);
    assert_eq!(processes_mentioning(&profile), Vec::<String>::new());
    assert!(!Path::new(&format!("/proc/{driver}")).exists());
}
