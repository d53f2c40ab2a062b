//! The one way gpubake builds an HTTP client, so the wheel cache and the Debian archive client
//! trust the same certificates and give up after the same kinds of stall.

use std::time::Duration;

/// A blocking HTTP agent that reports every status to the caller (none is an error) and gives
/// up on name resolution or a connection after `connect`, and on a response or a read that
/// stalls after `read`.
///
/// TLS is verified with the platform verifier, which reads the system trust store (and
/// `SSL_CERT_FILE`): that is where a TLS-intercepting proxy's CA is installed, and the bundled
/// Mozilla roots would refuse it.
pub fn agent(connect: Duration, read: Duration) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    let config = ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_resolve(Some(connect))
        .timeout_connect(Some(connect))
        .timeout_recv_response(Some(read))
        .timeout_per_read(Some(read))
        .user_agent(format!("gpubake/{}", env!("CARGO_PKG_VERSION")))
        .build();
    ureq::Agent::new_with_config(config)
}
