//! Plugins as OCI artifacts: `mst plugin push` and `mst plugin install oci://…`.
//!
//! A plugin is stored the way WebAssembly components are shipped (the CNCF wasm OCI artifact
//! layout, as wasm-pkg-tools writes it): an image manifest whose config has media type
//! [`CONFIG_MEDIA_TYPE`] and whose one layer is the component, [`LAYER_MEDIA_TYPE`]. A pull is
//! always verified: the manifest against the digest the registry names, the component against
//! the layer digest the manifest names, so a blob altered in the registry's storage is refused.
//!
//! Credentials come from a secrets file (`OCI_USERNAME`, `OCI_PASSWORD`) or the `auths` of the
//! Docker config; they are handed to the client in memory only, never written anywhere by mst.
//! Plain HTTP is used only for a registry on loopback (as Docker allows); TLS everywhere else.

use crate::secrets::{self, Secret, Secrets};
use anyhow::{bail, Context, Result};
use base64::Engine as _;
use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The config media type of a wasm component artifact.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a wasm component.
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
/// What a reference starts with on mst's command line and in configs.
pub const SCHEME: &str = "oci://";

/// The secret names `--secrets-file` gives a registry's user and password.
const USERNAME_SECRET: &str = "OCI_USERNAME";
const PASSWORD_SECRET: &str = "OCI_PASSWORD";

/// An `oci://registry/repository:tag` (or `@sha256:…`) reference.
#[derive(Debug, Clone)]
pub struct OciRef {
    reference: Reference,
}

impl OciRef {
    /// Parses `oci://…`; the registry must be written out (no implied Docker Hub), and a tag or
    /// digest given.
    pub fn parse(text: &str) -> Result<Self> {
        let Some(rest) = text.strip_prefix(SCHEME) else {
            bail!("`{text}` is not an OCI reference: write oci://REGISTRY/REPOSITORY:TAG");
        };
        let first = rest.split('/').next().unwrap_or_default();
        if !rest.contains('/')
            || !(first.contains('.') || first.contains(':') || first == "localhost")
        {
            bail!(
                "`{text}` names no registry: write oci://REGISTRY/REPOSITORY:TAG, e.g. \
                 oci://registry.example.com/mst/exact:1.0.0"
            );
        }
        let reference: Reference = rest
            .parse()
            .with_context(|| format!("`{text}` is not a valid OCI reference"))?;
        // The parser would imply `latest`; an install that is pinned by what it names wants
        // the tag written out.
        let last = rest.rsplit('/').next().unwrap_or_default();
        if !last.contains(':') && !rest.contains('@') {
            bail!("`{text}` has no tag: write oci://REGISTRY/REPOSITORY:TAG or @sha256:DIGEST");
        }
        Ok(OciRef { reference })
    }

    /// The registry host (and port).
    pub fn registry(&self) -> &str {
        self.reference.resolve_registry()
    }

    /// The reference as a pinned `oci://…@sha256:…` for `digest`.
    pub fn with_digest(&self, digest: &str) -> String {
        let r = &self.reference;
        format!("{SCHEME}{}/{}@{digest}", r.registry(), r.repository())
    }
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SCHEME}{}", self.reference.whole())
    }
}

/// How to reach a registry: where credentials come from and which CA to trust besides the
/// system's.
#[derive(Debug, Default, Clone)]
pub struct Access {
    /// A secrets file (JSON or dotenv) with `OCI_USERNAME` and `OCI_PASSWORD`.
    pub secrets_file: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for the registry's TLS.
    pub ca_file: Option<PathBuf>,
}

/// A component pulled and verified.
pub struct Pulled {
    /// The component.
    pub bytes: Vec<u8>,
    /// The manifest's digest, `sha256:…`.
    pub manifest_digest: String,
}

/// The largest component mst pulls, as for a file (`files::MAX_INPUT_BYTES`).
const MAX_COMPONENT_BYTES: u64 = crate::files::MAX_INPUT_BYTES;

/// Whether `registry` (`host[:port]`) is on loopback: the only place plain HTTP is used.
fn on_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => registry.rsplit_once(':').map_or(registry, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn client(reference: &OciRef, access: &Access) -> Result<Client> {
    let registry = reference.registry().to_string();
    let mut config = ClientConfig {
        protocol: if on_loopback(&registry) {
            ClientProtocol::HttpsExcept(vec![registry])
        } else {
            ClientProtocol::Https
        },
        user_agent: concat!("mst/", env!("CARGO_PKG_VERSION")),
        connect_timeout: Some(std::time::Duration::from_secs(30)),
        read_timeout: Some(std::time::Duration::from_secs(120)),
        ..ClientConfig::default()
    };
    if let Some(ca) = &access.ca_file {
        let pem = crate::files::read_input(ca).with_context(|| format!("--ca {}", ca.display()))?;
        config
            .extra_root_certificates
            .push(oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data: pem,
            });
    }
    // oci-client builds its own reqwest client, on the process's rustls provider.
    crate::net::install_tls_provider();
    Ok(Client::new(config))
}

/// The credentials for `registry`: the secrets file's, else the Docker config's, else none.
fn auth(registry: &str, access: &Access) -> Result<RegistryAuth> {
    if let Some(path) = &access.secrets_file {
        // Parsed here rather than by `Secrets::load`, so that only the password is held for
        // redaction (a user name is no secret, and a short one would only warn).
        let text = crate::files::read_input(path)
            .and_then(|b| String::from_utf8(b).context("not UTF-8"))
            .and_then(|t| Secrets::parse(&t))
            .with_context(|| format!("--secrets-file {}", path.display()))?;
        let (Some(user), Some(password)) = (text.get(USERNAME_SECRET), text.get(PASSWORD_SECRET))
        else {
            bail!(
                "--secrets-file {}: a registry login needs both {USERNAME_SECRET} and \
                 {PASSWORD_SECRET}",
                path.display()
            );
        };
        secrets::hold(PASSWORD_SECRET, &password);
        return Ok(RegistryAuth::Basic(
            user.expose().to_string(),
            password.expose().to_string(),
        ));
    }
    docker_auth(registry)
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(Path::new(&dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| Path::new(&home).join(".docker/config.json"))
}

/// The part of a Docker config mst reads.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
    #[serde(default)]
    creds_store: Option<String>,
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// A Docker config key (`host`, `https://host/v1/`) as the bare host it stands for.
fn docker_key_host(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// The Docker config's `auths` entry for `registry`: `auth` (base64 `user:password`) or
/// `username` and `password`. Credential helpers are not run: a registry only they know is
/// reached anonymously, with a warning.
fn docker_auth(registry: &str) -> Result<RegistryAuth> {
    let Some(path) = docker_config_path() else {
        return Ok(RegistryAuth::Anonymous);
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(RegistryAuth::Anonymous);
    };
    let config: DockerConfig =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let same = |key: &str| {
        let host = docker_key_host(key);
        host == registry || (registry == "index.docker.io" && host.ends_with("docker.io"))
    };
    let entry = config
        .auths
        .iter()
        .find(|(key, _)| same(key))
        .map(|(_, a)| a);
    let login = match entry {
        Some(DockerAuth {
            auth: Some(encoded),
            ..
        }) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .with_context(|| {
                    format!(
                        "{}: auths.{registry}.auth is not base64 of USER:PASSWORD",
                        path.display()
                    )
                })?;
            let Some((user, password)) = decoded.split_once(':') else {
                bail!(
                    "{}: auths.{registry}.auth is not USER:PASSWORD",
                    path.display()
                );
            };
            Some((user.to_string(), password.to_string()))
        }
        Some(DockerAuth {
            username: Some(user),
            password: Some(password),
            ..
        }) => Some((user.clone(), password.clone())),
        _ => None,
    };
    match login {
        Some((user, password)) => {
            // Held so that nothing mst writes (a log line, an error) can show it.
            secrets::hold("docker-config", &Secret::new(password.clone()));
            Ok(RegistryAuth::Basic(user, password))
        }
        None => {
            if config.cred_helpers.keys().any(|k| same(k)) || config.creds_store.is_some() {
                tracing::warn!(
                    "{}: credential helpers are not supported; reaching {registry} \
                     anonymously (give a login with --secrets-file)",
                    path.display()
                );
            }
            Ok(RegistryAuth::Anonymous)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the registry client")
}

/// A registry client error as an error that says what went wrong in mst's terms: a login
/// wanted, a tag that does not exist, or else the client's own words.
fn explain(error: oci_client::errors::OciDistributionError, doing: String) -> anyhow::Error {
    let text = error.to_string();
    let lower = text.to_lowercase();
    let hint = if lower.contains("unauthorized") || lower.contains("code: 401") {
        "the registry wants a login: give --secrets-file FILE with OCI_USERNAME and \
         OCI_PASSWORD, or an `auths` entry in the Docker config (`docker login`)"
    } else if lower.contains("manifest unknown") || lower.contains("name unknown") {
        "no such tag or repository in the registry"
    } else {
        ""
    };
    match hint {
        "" => anyhow::anyhow!("{doing}: {text}"),
        hint => anyhow::anyhow!("{doing}: {hint} ({text})"),
    }
}

/// `sha256:` and the hex digest of `bytes`.
fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", super::loaded::digest(bytes))
}

/// The artifact's config: what the wasm OCI artifact spec asks for, from what mst knows.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ArtifactConfig<'a> {
    architecture: &'a str,
    os: &'a str,
    layer_digests: Vec<String>,
}

/// Pushes `bytes` to `reference` with `annotations`; returns the manifest's digest.
pub fn push(
    bytes: &[u8],
    reference: &OciRef,
    annotations: BTreeMap<String, String>,
    access: &Access,
) -> Result<String> {
    if reference.reference.tag().is_none() || reference.reference.digest().is_some() {
        bail!("{reference}: push to a tag (oci://REGISTRY/REPOSITORY:TAG), not a digest");
    }
    let client = client(reference, access)?;
    let auth = auth(reference.registry(), access)?;
    let config = serde_json::to_vec(&ArtifactConfig {
        architecture: "wasm",
        os: "wasip2",
        layer_digests: vec![sha256(bytes)],
    })?;
    let layers = [ImageLayer::new(
        bytes.to_vec(),
        LAYER_MEDIA_TYPE.to_string(),
        None,
    )];
    let config = Config::new(config, CONFIG_MEDIA_TYPE.to_string(), None);
    let manifest = OciImageManifest::build(&layers, &config, Some(annotations));
    runtime()?.block_on(async {
        client
            .push(&reference.reference, &layers, config, &auth, Some(manifest))
            .await
            .map_err(|e| explain(e, format!("cannot push to {reference}")))?;
        // The registry's digest of what it stored, which is what a pull verifies against.
        client
            .fetch_manifest_digest(&reference.reference, &auth)
            .await
            .map_err(|e| explain(e, format!("pushed, but cannot read back {reference}")))
    })
}

/// Pulls the component `reference` names and verifies it: the manifest must be a wasm
/// artifact with one component layer, and the layer's bytes must have the manifest's digest.
pub fn pull(reference: &OciRef, access: &Access) -> Result<Pulled> {
    let client = client(reference, access)?;
    let auth = auth(reference.registry(), access)?;
    runtime()?.block_on(async {
        let (manifest, manifest_digest) =
            client
                .pull_manifest(&reference.reference, &auth)
                .await
                .map_err(|e| explain(e, format!("cannot fetch {reference}")))?;
        let OciManifest::Image(manifest) = manifest else {
            bail!("{reference} is an image index, not a wasm component artifact");
        };
        let layers: Vec<_> = manifest
            .layers
            .iter()
            .filter(|l| {
                l.media_type == LAYER_MEDIA_TYPE
                    || l.media_type == oci_client::manifest::WASM_LAYER_MEDIA_TYPE
            })
            .collect();
        let [layer] = layers[..] else {
            bail!(
                "{reference} is not a wasm component artifact: it needs exactly one \
                 `{LAYER_MEDIA_TYPE}` layer, it has {}",
                layers.len()
            );
        };
        if layer.size < 0 || layer.size as u64 > MAX_COMPONENT_BYTES {
            bail!(
                "{reference}: the component is {} bytes, over the {MAX_COMPONENT_BYTES} byte limit",
                layer.size
            );
        }
        let mut stream = client
            .pull_blob_stream(&reference.reference, layer)
            .await
            .map_err(|e| explain(e, format!("cannot fetch the component of {reference}")))?
            .stream;
        let mut bytes = Vec::with_capacity(layer.size as usize);
        let tampered = || {
            format!(
                "{reference}: the component blob does not match the digest its manifest \
                 names ({}): the registry's copy was altered or damaged; nothing was installed",
                layer.digest
            )
        };
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.with_context(tampered)?;
            if (bytes.len() + chunk.len()) as u64 > layer.size as u64 {
                bail!("{}", tampered());
            }
            bytes.extend_from_slice(&chunk);
        }
        let actual = sha256(&bytes);
        if actual != layer.digest {
            bail!("{} (got {actual})", tampered());
        }
        Ok(Pulled {
            bytes,
            manifest_digest,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_must_name_a_registry_and_a_tag() {
        let r = OciRef::parse("oci://127.0.0.1:5000/mst/exact:1.0.0").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/mst/exact:1.0.0");
        for bad in [
            "127.0.0.1:5000/mst/exact:1.0.0",
            "oci://mst/exact:1.0.0",
            "oci://registry.example.com/mst/exact",
        ] {
            assert!(OciRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn docker_config_keys_are_matched_by_host() {
        assert_eq!(
            docker_key_host("https://index.docker.io/v1/"),
            "index.docker.io"
        );
        assert_eq!(docker_key_host("http://127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(
            docker_key_host("registry.example.com"),
            "registry.example.com"
        );
    }

    #[test]
    fn plain_http_only_on_loopback() {
        for local in [
            "127.0.0.1:5000",
            "localhost:5000",
            "[::1]:5000",
            "127.8.0.1",
        ] {
            assert!(on_loopback(local), "{local}");
        }
        for remote in [
            "registry.example.com",
            "10.0.0.1:5000",
            "localhost.example.com:5000",
        ] {
            assert!(!on_loopback(remote), "{remote}");
        }
    }
}
