//! MST server entries → mst's: stdio entries without `transport`, HTTP entries with `url`
//! and a `token` named by an environment variable (a token written in the MST file is never
//! copied).

use super::format::shape;
use super::format::v2::{Auth, Server};
use super::Source;
use crate::import::Change;
use serde_json::{json, Map, Value};

/// Settings of MST's server entries that mst has no equivalent for.
const UNSUPPORTED: [&str; 12] = [
    "capabilities",
    "protocol",
    "protocolProbe",
    "connectTimeoutMs",
    "requestTimeoutMs",
    "callTimeoutMs",
    "retryAttempts",
    "proxy",
    "tls",
    "quiet",
    "minTools",
    "files",
];

/// The config's `servers` → mst's, by label; entries mst cannot reach are left out
/// (reported).
pub(super) fn convert(
    src: &mut Source,
    entries: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut servers = Map::new();
    for (label, entry) in entries.into_iter().flatten() {
        if let Some(server) = server_of(src, label, entry) {
            servers.insert(label.clone(), server);
        }
    }
    servers
}

/// An MST server entry → mst's; `None` (reported) when mst cannot reach it.
fn server_of(src: &mut Source, label: &str, entry: &Value) -> Option<Value> {
    let at = format!("servers.{label}");
    if !entry.is_object() {
        src.note(&at, Change::Dropped, "not an object");
        return None;
    }
    let server: Server = shape(entry);
    if server.connector.is_some() {
        src.note(&at, Change::Dropped, "connector servers (signed in with `mst auth`) have no mst equivalent: give the server's URL and a token");
        return None;
    }
    let http = match server.transport.as_deref() {
        Some("stdio") => false,
        Some(_) => true,
        None => server.command.is_none(),
    };
    let mut out = Map::new();
    let entry = Entry {
        label,
        at: &at,
        server: &server,
    };
    if http {
        entry.http(src, &mut out);
    } else {
        entry.stdio(src, &mut out);
    }
    for key in server.rest.keys() {
        let text = if UNSUPPORTED.contains(&key.as_str()) {
            "mst has no such server setting (the trial's `timeout` bounds every call)".to_string()
        } else {
            entry.not_applicable(key, http)
        };
        src.note(&format!("{at}.{key}"), Change::Dropped, text);
    }
    if !http {
        let text = "stdio server: `transport` removed (an entry without `url` is stdio)";
        src.note(&at, Change::Rewritten, text);
    }
    Some(Value::Object(out))
}

/// One server entry as it converts.
struct Entry<'a> {
    label: &'a str,
    /// `servers.LABEL`.
    at: &'a str,
    server: &'a Server,
}

impl Entry<'_> {
    /// A stdio entry's keys; an HTTP key is reported as not applying.
    fn stdio(&self, src: &mut Source, out: &mut Map<String, Value>) {
        let server = self.server;
        for (key, value) in [
            ("args", &server.args),
            ("command", &server.command),
            ("env", &server.env),
        ] {
            if let Some(value) = value {
                out.insert(key.into(), value.clone());
            }
        }
        if let Some(cwd) = &server.cwd {
            src.note(&self.here("cwd"), Change::Dropped, format!("{cwd}: mst starts a stdio server in the trial's scratch directory (`cwd` may only name a directory inside it); use absolute paths in `args`"));
        }
        if server.inherit_env.is_some() {
            src.note(&self.here("inheritEnv"), Change::Dropped, "a stdio server gets only its `env`, `envSecrets` and PATH, HOME, TMPDIR and the locale: list every variable it needs in `env`");
        }
        self.label_removed(src);
        self.not_applying(
            src,
            false,
            [
                ("auth", &server.auth),
                ("headers", &server.headers),
                ("serverUrl", &server.server_url),
                ("url", &server.url),
            ],
        );
    }

    /// An HTTP entry's keys; a stdio key is reported as not applying.
    fn http(&self, src: &mut Source, out: &mut Map<String, Value>) {
        let server = self.server;
        if let Some(auth) = &server.auth {
            auth_of(src, self.label, &self.here("auth"), &shape(auth), out);
        }
        if let Some(headers) = &server.headers {
            out.insert("headers".into(), headers.clone());
            src.note(&self.here("headers"), Change::Approximated, "written as given: move any secret value into `headerSecrets` (values from `--secrets-file` or `env:VAR`)");
        }
        self.label_removed(src);
        if let Some(url) = &server.server_url {
            out.insert("url".into(), url.clone());
            src.note(&self.here("serverUrl"), Change::Rewritten, "→ `url`");
        }
        // `url` wins over `serverUrl`, as the later key always has.
        if let Some(url) = &server.url {
            out.insert("url".into(), url.clone());
        }
        self.not_applying(
            src,
            true,
            [
                ("args", &server.args),
                ("command", &server.command),
                ("cwd", &server.cwd),
                ("env", &server.env),
                ("inheritEnv", &server.inherit_env),
            ],
        );
    }

    /// Reports the keys given of `keys`, which belong to the other kind of server.
    fn not_applying<const N: usize>(
        &self,
        src: &mut Source,
        http: bool,
        keys: [(&str, &Option<Value>); N],
    ) {
        for (key, value) in keys {
            if value.is_some() {
                src.note(
                    &self.here(key),
                    Change::Dropped,
                    self.not_applicable(key, http),
                );
            }
        }
    }

    /// `label`, which the map key replaces.
    fn label_removed(&self, src: &mut Source) {
        if self.server.label.is_some() {
            let text = "removed: the map key is the label";
            src.note(&self.here("label"), Change::Rewritten, text);
        }
    }

    fn not_applicable(&self, key: &str, http: bool) -> String {
        let kind = if http { "HTTP" } else { "stdio" };
        format!("`{key}` does not apply to a {kind} server")
    }

    fn here(&self, key: &str) -> String {
        format!("{}.{key}", self.at)
    }
}

/// An HTTP server's `auth` → `token`. A token written in the MST file is never copied into
/// mst's files: the entry names an environment variable to hold it instead.
fn auth_of(src: &mut Source, label: &str, at: &str, auth: &Auth, out: &mut Map<String, Value>) {
    if let Some(var) = &auth.access_token_env {
        out.insert("token".into(), json!(format!("env:{var}")));
        src.note(
            at,
            Change::Rewritten,
            format!("`accessTokenEnv` → `token: \"env:{var}\"`"),
        );
    } else if auth.access_token.is_some() {
        let var = format!(
            "{}_TOKEN",
            label
                .to_ascii_uppercase()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>()
        );
        out.insert("token".into(), json!(format!("env:{var}")));
        src.note(
            at,
            Change::Rewritten,
            format!("the token written in the config (not copied) → `token: \"env:{var}\"`"),
        );
        src.report.todo(format!("export {var} with server `{label}`'s token (MST's config held it in `auth.accessToken`)"));
    }
    for (key, given) in [
        ("oauth", &auth.oauth),
        ("clientCredentials", &auth.client_credentials),
    ] {
        if given.is_some() {
            src.note(
                &format!("{at}.{key}"),
                Change::Dropped,
                "mst does not sign in: get a token yourself and give it as `token`",
            );
            src.report.todo(format!(
                "give server `{label}` a `token` (MST signed in with `auth.{key}`)"
            ));
        }
    }
}
