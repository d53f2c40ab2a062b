//! The one HTTP stack of gpubake: reqwest, the client oci-client speaks to registries with.
//! The wheel cache and the Debian archive client take their blocking client from here, so
//! every request trusts the same certificates, follows the same proxy settings and gives up
//! after the same kinds of stall as the registry client does.

use crate::error::{Error, Result};
use std::time::Duration;

/// The user agent of every request gpubake makes.
pub const USER_AGENT: &str = concat!("gpubake/", env!("CARGO_PKG_VERSION"));

/// Makes ring the process's TLS crypto provider. reqwest's rustls is built without one of
/// its own (so no second crypto library is compiled); a second install is refused, which is
/// fine.
pub fn use_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A blocking HTTP client that reports every status to the caller (none is an error), gives
/// up on name resolution and a connection after `connect`, and on a response or a read that
/// stalls after `read`; a download as a whole may take as long as it keeps moving.
///
/// TLS is verified with the platform verifier, which reads the system trust store (and
/// `SSL_CERT_FILE`): that is where a TLS-intercepting proxy's CA is installed, and the bundled
/// Mozilla roots would refuse it. `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`
/// (either case) are followed, as curl and pip follow them.
pub fn client(connect: Duration, read: Duration) -> Result<reqwest::blocking::Client> {
    use_ring();
    reqwest::blocking::Client::builder()
        .connect_timeout(connect)
        // The blocking client's timeout bounds the wait for the response and each read of
        // its body, not the whole transfer.
        .timeout(read)
        .user_agent(USER_AGENT)
        .build()
        .map_err(|e| Error::Environment(format!("cannot set up an HTTP client: {}", chain(&e))))
}

/// The error's sources, joined: reqwest hides the useful part (a refused certificate, a
/// refused connection) a few levels down.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = below(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = below(s);
    }
    parts.join(": ")
}

/// Whether a request failed on the peer's certificate: not a stall to retry, but a trust
/// store to fix.
pub fn is_certificate_refusal(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return matches!(
                tls,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            );
        }
        source = below(s);
    }
    false
}

/// The error one level down. The TLS stream wraps rustls's error in an io::Error (twice,
/// through the connector), and io::Error's own `source()` skips what it wraps.
fn below<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a (dyn std::error::Error + 'static)> {
    match e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        Some(inner) => Some(inner),
        None => e.source(),
    }
}
