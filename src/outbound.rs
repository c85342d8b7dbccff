//! The one outgoing HTTP client stack: every request toolgate sends (the http adapter and
//! the builtins that call out, checkpoint webhooks, OTLP trace export, the MCP client)
//! goes through a reqwest client made by [`builder`] or [`builder_trusting`], over rustls
//! with the AWS-LC crypto provider (docs/decisions.md says why).
//!
//! INVARIANT: no redirect is followed, and a proxy is used only for a tool's upstream
//! (and its token endpoint): the one the registry names for it, else the environment's
//! `HTTPS_PROXY`/`HTTP_PROXY` (less `NO_PROXY` and loopback hosts). A proxy is told the
//! host the caller checked and nothing else, and the other clients (webhooks, shipping,
//! witnesses, OTLP, key sets) never use one. Server certificates are always verified
//! (against the system's roots, or only the given CA bundle), never skipped, through a
//! proxy too (https goes through it with CONNECT).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The largest CA bundle file read (a system bundle is about 200 KiB).
const MAX_CA_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// A problem with a CA bundle or with building a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundError {
    /// The CA bundle cannot be read or holds no usable certificate.
    CaFile { path: PathBuf, what: String },
    /// The client could not be built.
    Build(String),
}

impl fmt::Display for OutboundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboundError::CaFile { path, what } => {
                write!(f, "CA bundle `{}`: {what}", path.display())
            }
            OutboundError::Build(what) => write!(f, "cannot build an http client: {what}"),
        }
    }
}

impl std::error::Error for OutboundError {}

/// The crypto provider of every TLS connection: AWS-LC, the one crypto library of the
/// binary (TLS, JWT signatures, the audit log's signatures; docs/decisions.md).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The verifier trusting the operating system's roots (`/etc/ssl/certs`, or
/// `SSL_CERT_FILE` / `SSL_CERT_DIR`), made once per process. Without any system root,
/// https requests fail at the handshake with a message saying so; http still works.
fn system_verifier() -> Arc<dyn ServerCertVerifier> {
    static VERIFIER: OnceLock<Arc<dyn ServerCertVerifier>> = OnceLock::new();
    VERIFIER
        .get_or_init(|| match rustls_platform_verifier::Verifier::new(provider()) {
            Ok(verifier) => Arc::new(verifier),
            Err(e) => {
                tracing::warn!(error = %e, "no trusted CA certificates on this system; https requests will be refused");
                Arc::new(NoRoots(e.to_string()))
            }
        })
        .clone()
}

/// TLS trusting the operating system's roots, made once per process.
fn system_tls() -> Result<ClientConfig, String> {
    static CONFIG: OnceLock<Result<ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| tls_with(system_verifier(), None).map_err(|e| e.to_string()))
        .clone()
}

/// The TLS client configuration trusting the system's roots, for other clients of
/// the one rustls stack (the cluster database connection).
pub fn system_tls_config() -> Result<ClientConfig, String> {
    system_tls()
}

fn tls_with(
    verifier: Arc<dyn ServerCertVerifier>,
    identity: Option<&ClientIdentity>,
) -> Result<ClientConfig, rustls::Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match identity {
        Some(identity) => {
            builder.with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

/// A TLS client certificate and its key (mutual TLS), from PEM.
pub struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("certificates", &self.chain.len())
            .finish()
    }
}

impl ClientIdentity {
    /// The certificate chain (leaf first) and the private key, each PEM.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<ClientIdentity, String> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the certificate file is not PEM: {e}"))?;
        if chain.is_empty() {
            return Err("the certificate file holds no `BEGIN CERTIFICATE` block".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| format!("the key file holds no usable private key: {e}"))?;
        let identity = ClientIdentity { chain, key };
        // The pair must be usable together (a key of another certificate is refused).
        tls_with(system_verifier(), Some(&identity)).map_err(|e| e.to_string())?;
        Ok(identity)
    }
}

/// A client builder for one upstream: trusting only `ca` when given (else the
/// system's roots), presenting `identity` when given, through `proxy` when given (an
/// `http://` proxy; https goes through it with CONNECT, and the certificate is still
/// the upstream's, verified end to end), else through the environment's proxies
/// ([`environment_proxies`]).
pub fn builder_for(
    ca: Option<&CaBundle>,
    identity: Option<&ClientIdentity>,
    proxy: Option<&str>,
) -> Result<reqwest::ClientBuilder, OutboundError> {
    let verifier = match ca {
        Some(ca) => ca.verifier.clone(),
        None => system_verifier(),
    };
    let tls = tls_with(verifier, identity).map_err(|e| OutboundError::Build(e.to_string()))?;
    let mut builder = base().tls_backend_preconfigured(tls);
    match proxy {
        Some(proxy) => {
            let proxy = reqwest::Proxy::all(proxy)
                .map_err(|e| OutboundError::Build(format!("proxy: {}", error_chain(&e))))?;
            builder = builder.proxy(proxy);
        }
        None => {
            for proxy in environment_proxies(|name| std::env::var(name).ok())? {
                builder = builder.proxy(proxy);
            }
        }
    }
    Ok(builder)
}

/// Hosts that never go through a proxy of the environment (as Go's net/http): a sidecar's
/// loopback upstreams are on its own host.
const NEVER_PROXIED: &str = "localhost,127.0.0.0/8,::1";

/// The proxies `var` names (the environment's, read when a policy's adapters are built):
/// `HTTPS_PROXY` for https upstreams and `HTTP_PROXY` for http ones (either name in lower
/// case too; an empty value is none), skipping the hosts of `NO_PROXY` (reqwest's
/// syntax: names match their subdomains, IP ranges in CIDR, `*` all) and loopback hosts.
/// A value that is not a proxy URL is an error, not ignored.
pub fn environment_proxies(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Vec<reqwest::Proxy>, OutboundError> {
    let read = |upper: &str, lower: &str| {
        var(upper)
            .or_else(|| var(lower))
            .filter(|v| !v.trim().is_empty())
    };
    let skipped = match read("NO_PROXY", "no_proxy") {
        Some(list) => format!("{NEVER_PROXIED},{list}"),
        None => NEVER_PROXIED.to_string(),
    };
    let mut proxies = Vec::new();
    for (upper, lower, https) in [
        ("HTTPS_PROXY", "https_proxy", true),
        ("HTTP_PROXY", "http_proxy", false),
    ] {
        let Some(url) = read(upper, lower) else {
            continue;
        };
        let proxy = if https {
            reqwest::Proxy::https(url.trim())
        } else {
            reqwest::Proxy::http(url.trim())
        }
        .map_err(|e| OutboundError::Build(format!("`{upper}`: {}", error_chain(&e))))?;
        proxies.push(proxy.no_proxy(reqwest::NoProxy::from_string(&skipped)));
    }
    Ok(proxies)
}

/// The verifier when the system has no root certificate: refuses every server.
#[derive(Debug)]
struct NoRoots(String);

impl ServerCertVerifier for NoRoots {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Err(rustls::Error::General(format!(
            "no trusted CA certificates: {}",
            self.0
        )))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("no trusted CA certificates".into()))
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("no trusted CA certificates".into()))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Certificates to trust instead of the system's roots (a private CA), read from a PEM
/// file of one or more `CERTIFICATE` blocks.
#[derive(Clone)]
pub struct CaBundle {
    path: PathBuf,
    verifier: Arc<dyn ServerCertVerifier>,
    config: ClientConfig,
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaBundle")
            .field("path", &self.path)
            .finish()
    }
}

impl CaBundle {
    /// Reads and checks the bundle: at least one certificate, every one usable as a
    /// trust anchor.
    pub fn load(path: &Path) -> Result<CaBundle, OutboundError> {
        let fail = |what: String| OutboundError::CaFile {
            path: path.to_path_buf(),
            what,
        };
        let bytes = crate::localfile::read(path, MAX_CA_FILE_BYTES)
            .map_err(|e| fail(format!("cannot read: {e}")))?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&bytes) {
            let cert = cert.map_err(|e| fail(format!("not a PEM certificate file: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| fail(format!("a certificate is not usable as a CA: {e}")))?;
        }
        if roots.is_empty() {
            return Err(fail("holds no `BEGIN CERTIFICATE` block".into()));
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .map_err(|e| fail(e.to_string()))?;
        let verifier: Arc<dyn ServerCertVerifier> = verifier;
        Ok(CaBundle {
            path: path.to_path_buf(),
            config: tls_with(verifier.clone(), None).map_err(|e| fail(e.to_string()))?,
            verifier,
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A client builder with the project's settings, trusting the system's roots: no
/// redirects, no proxy (not even from `HTTP_PROXY`), HTTP/1.1, rustls with ring, a
/// `toolgate/<version>` user agent. Callers add their own timeouts and pool settings.
pub fn builder() -> reqwest::ClientBuilder {
    match system_tls() {
        Ok(tls) => base().tls_backend_preconfigured(tls),
        Err(e) => {
            tracing::error!(error = %e, "cannot set up TLS");
            // A value reqwest does not know as a TLS set-up: `build()` then fails with
            // an error (fail closed), where a default set-up would panic.
            base().tls_backend_preconfigured(())
        }
    }
}

/// The TLS client set-up for a raw TLS connection (syslog over TLS): trusting only
/// `ca` when given, else the system's roots.
pub fn tls_config(ca: Option<&CaBundle>) -> Result<Arc<ClientConfig>, String> {
    match ca {
        Some(ca) => Ok(Arc::new(ca.config.clone())),
        None => system_tls().map(Arc::new),
    }
}

/// [`builder`], trusting only the certificates of `ca` (not the system's roots).
pub fn builder_trusting(ca: &CaBundle) -> reqwest::ClientBuilder {
    base().tls_backend_preconfigured(ca.config.clone())
}

fn base() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("toolgate/", env!("CARGO_PKG_VERSION")))
        .http1_only()
}

/// An error and its sources, joined by `: ` (reqwest's own text names only the outer
/// layer, e.g. "error sending request"; the cause, such as "connection refused" or
/// "invalid peer certificate: UnknownIssuer", is in its sources). Bounded.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    let mut depth = 0;
    while let Some(s) = source {
        if depth >= 8 {
            break;
        }
        let next = s.to_string();
        // Some layers repeat their source's text; say it once.
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
        depth += 1;
    }
    if text.len() > 512 {
        text = format!(
            "{}{}",
            crate::text::prefix_bytes(&text, 512),
            crate::text::MARK
        );
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_environments_proxies_are_read_and_a_bad_one_is_an_error() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(environment_proxies(env(&[])).unwrap().is_empty());
        assert!(
            environment_proxies(env(&[("HTTPS_PROXY", " ")]))
                .unwrap()
                .is_empty()
        );
        const BOTH: &[(&str, &str)] = &[
            ("https_proxy", "http://127.0.0.1:3128"),
            ("HTTP_PROXY", "http://proxy.internal:3128"),
        ];
        assert_eq!(environment_proxies(env(BOTH)).unwrap().len(), 2);
        let bad = environment_proxies(env(&[("HTTPS_PROXY", "http://[::1")])).unwrap_err();
        assert!(bad.to_string().contains("HTTPS_PROXY"), "{bad}");
    }

    #[test]
    fn clients_build_without_a_runtime_and_without_a_default_provider() {
        // No process-wide rustls provider is installed; reqwest would panic building a
        // client that relied on one.
        assert!(CryptoProvider::get_default().is_none());
        builder().build().unwrap();
    }

    #[test]
    fn a_ca_bundle_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let e = CaBundle::load(&empty).unwrap_err();
        assert!(e.to_string().contains("no `BEGIN CERTIFICATE`"), "{e}");
        let missing = dir.path().join("missing.pem");
        assert!(CaBundle::load(&missing).is_err());
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(CaBundle::load(&garbage).is_err());
    }

    /// Every reqwest client of the crate is made here, so none misses the settings
    /// above (no redirects, no proxy, the TLS stack): reqwest's own default TLS set-up
    /// would also panic without a process-wide crypto provider.
    #[test]
    fn no_other_module_builds_a_reqwest_client() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut offenders = Vec::new();
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("outbound.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for needle in [
                        "Client::builder()",
                        "reqwest::Client::new",
                        "ClientBuilder::new",
                    ] {
                        if text.contains(needle) {
                            offenders.push(format!("{}: {needle}", path.display()));
                        }
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "build clients with crate::outbound::builder(): {offenders:?}"
        );
    }
}
