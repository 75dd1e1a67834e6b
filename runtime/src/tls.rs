//! TLS on every port, with rustls.
//!
//! A coordinator holds one certificate and key (`ServerTls`), served on its worker, client and
//! HTTP ports, and on its peer port with the other members required to present a certificate
//! of the group's CA (mutual TLS); it presents the same certificate when it dials the other
//! members. Workers and clients verify the coordinator against a CA file or the system's roots
//! (`ClientTls`). A reload (SIGHUP) reads the files again, whole or not at all; connections
//! opened afterwards use what was read, open ones keep theirs.
//!
//! On a port that speaks TLS the first byte a client sends is a TLS record's (22). A client
//! that sends anything else speaks the plain protocol and is told, in that protocol, that the
//! port wants TLS, rather than being cut off without a word.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 22;

/// Why TLS could not be set up from the files given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain in a PEM file (the node's certificate first).
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certificates.is_empty() {
        return Err(file_error(path, "no PEM certificate in the file"));
    }
    Ok(certificates)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, format!("no private key: {e}")))
}

fn read_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots
            .add(certificate)
            .map_err(|e| file_error(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// Where a coordinator's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: this node's certificate, then any intermediates.
    pub cert: PathBuf,
    /// PEM: its private key.
    pub key: PathBuf,
    /// PEM: the CA the group's certificates are issued by. Required for the peer link (each
    /// member checks the others against it); also what the HTTP server's own client trusts.
    pub ca: Option<PathBuf>,
}

/// Everything read from one version of the files.
struct Loaded {
    /// Worker, client and HTTP ports: the server proves itself; callers prove themselves with
    /// their secret or token inside.
    server: Arc<ServerConfig>,
    /// Peer port: both sides present a certificate of the group's CA.
    mutual: Option<Arc<ServerConfig>>,
    /// Dialing another member: verify it against the CA, present our own certificate.
    peer_client: Option<ClientTls>,
    /// Dialing our own or another member's client port (the HTTP server's client).
    client: Option<ClientTls>,
}

impl Loaded {
    fn read(files: &TlsFiles) -> Result<Loaded, TlsError> {
        let chain = read_certificates(&files.cert)?;
        let key = read_key(&files.key)?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| file_error(&files.key, format!("does not fit the certificate: {e}")))?;
        let (mutual, peer_client, client) = match &files.ca {
            None => (None, None, None),
            Some(ca) => {
                let roots = read_roots(ca)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                        .build()
                        .map_err(|e| file_error(ca, e))?;
                let mutual = ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| TlsError::Config(e.to_string()))?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain.clone(), key.clone_key())
                    .map_err(|e| file_error(&files.key, e))?;
                let peer_client = client_config(roots.clone(), Some((chain, key)))?;
                let client = client_config(roots, None)?;
                (
                    Some(Arc::new(mutual)),
                    Some(ClientTls(Arc::new(peer_client))),
                    Some(ClientTls(Arc::new(client))),
                )
            }
        };
        Ok(Loaded {
            server: Arc::new(server),
            mutual,
            peer_client,
            client,
        })
    }
}

fn client_config(
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, TlsError> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_webpki_verifier(verifier);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| TlsError::Config(format!("the node's certificate as a client's: {e}"))),
    }
}

/// A coordinator's TLS: its certificate, key and CA, reloadable while it runs.
#[derive(Clone)]
pub struct ServerTls {
    files: Arc<TlsFiles>,
    loaded: Arc<RwLock<Arc<Loaded>>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish()
    }
}

/// Which side of TLS a port speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsPort {
    /// The server proves itself; the caller's credential is checked inside.
    ServerOnly,
    /// Both sides present a certificate of the group's CA (the peer link).
    Mutual,
}

impl ServerTls {
    /// Reads and checks the files. The peer link needs `ca`; see [`ServerTls::require_ca`].
    pub fn load(files: TlsFiles) -> Result<ServerTls, TlsError> {
        let loaded = Loaded::read(&files)?;
        Ok(ServerTls {
            files: Arc::new(files),
            loaded: Arc::new(RwLock::new(Arc::new(loaded))),
        })
    }

    /// An error unless a CA was given (a group's peer link verifies both sides against it).
    pub fn require_ca(&self) -> Result<(), TlsError> {
        if self.files.ca.is_none() {
            return Err(TlsError::Config(
                "the peer link uses mutual TLS: give --tls-ca, the CA that issued every member's certificate".to_owned(),
            ));
        }
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads the files again; on any error the old material stays in force.
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = Arc::new(Loaded::read(&self.files)?);
        let mut current = self
            .loaded
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = loaded;
        Ok(())
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The acceptor for a port, from the files as last read.
    pub fn acceptor(&self, port: TlsPort) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let loaded = self.current();
        let config = match port {
            TlsPort::ServerOnly => loaded.server.clone(),
            TlsPort::Mutual => loaded
                .mutual
                .clone()
                .ok_or_else(|| TlsError::Config("the peer link needs --tls-ca".to_owned()))?,
        };
        Ok(tokio_rustls::TlsAcceptor::from(config))
    }

    /// What a member dials the others with: their certificates checked against the CA, its
    /// own presented.
    pub fn peer_client(&self) -> Option<ClientTls> {
        self.current().peer_client.clone()
    }

    /// A client that trusts the group's CA (the HTTP server's, dialing client ports).
    pub fn client(&self) -> Option<ClientTls> {
        self.current().client.clone()
    }
}

/// How a worker or client verifies the coordinator.
#[derive(Clone)]
pub struct ClientTls(Arc<ClientConfig>);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// Trusts the CA certificates in `path` only.
    pub fn with_ca_file(path: &Path) -> Result<ClientTls, TlsError> {
        Ok(ClientTls(Arc::new(client_config(read_roots(path)?, None)?)))
    }

    /// Trusts the operating system's roots (for certificates from a public CA).
    pub fn with_system_roots() -> Result<ClientTls, TlsError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(TlsError::Config(format!(
                "no usable CA certificate among the system's roots{}; give --tls-ca",
                found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )));
        }
        Ok(ClientTls(Arc::new(client_config(Arc::new(roots), None)?)))
    }

    /// Runs the client side of TLS on `tcp`, verifying the server for the host of `address`.
    pub async fn connect(&self, address: &str, tcp: TcpStream) -> Result<Stream, DialTlsError> {
        let name = server_name(address).map_err(DialTlsError::Refused)?;
        let connector = tokio_rustls::TlsConnector::from(self.0.clone());
        match connector.connect(name, tcp).await {
            Ok(stream) => Ok(Stream::Tls(Box::new(stream.into()))),
            Err(error) => Err(classify(error)),
        }
    }
}

/// How a TLS handshake on a dialed connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialTlsError {
    /// Certificates or protocol did not agree: final until the configuration changes.
    Refused(String),
    /// The connection broke: worth another try.
    Broken(String),
}

fn classify(error: io::Error) -> DialTlsError {
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidMessage(_)) => DialTlsError::Refused(format!(
            "the server does not speak TLS on this port, or speaks it wrongly ({error})"
        )),
        Some(tls) => DialTlsError::Refused(format!("TLS handshake refused: {tls}")),
        None => DialTlsError::Broken(format!("TLS handshake broken: {error}")),
    }
}

/// The name a server's certificate must carry for `address` (`host:port`, `[v6]:port`): an IP
/// address or a DNS name.
pub fn server_name(address: &str) -> Result<ServerName<'static>, String> {
    if let Ok(socket) = address.parse::<SocketAddr>() {
        return Ok(ServerName::IpAddress(socket.ip().into()));
    }
    let host = address
        .rsplit_once(':')
        .map_or(address, |(host, _port)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host} is not a host name a certificate can name: {e}"))
}

/// Whether an accepted connection opens with a TLS record: waits for its first byte, without
/// consuming it.
pub async fn opens_with_tls(tcp: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let read = tcp.peek(&mut first).await?;
    if read == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(first[0] == TLS_HANDSHAKE_RECORD)
}

/// A connection: plain TCP, or TLS over it.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl From<TcpStream> for Stream {
    fn from(tcp: TcpStream) -> Stream {
        Stream::Plain(tcp)
    }
}

impl Stream {
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(tcp) => tcp,
            Stream::Tls(tls) => tls.get_ref().0,
        }
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.tcp().peer_addr().ok()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A throwaway CA and one certificate it issued, for local trials and tests: nothing here is
/// fit for production (the CA key is written beside the certificates).
pub mod throwaway {
    use std::path::Path;

    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    use super::TlsFiles;

    /// The files written by [`write`], in `dir`.
    pub const CA_FILE: &str = "ca.pem";
    pub const CERT_FILE: &str = "node.pem";
    pub const KEY_FILE: &str = "node-key.pem";

    /// Generates a CA and a certificate for `hosts` (DNS names or IP addresses), usable by
    /// a server and, on the peer link, as a client; writes them into `dir` (created if
    /// missing; the key readable by its owner only) and returns where.
    pub fn write(dir: &Path, hosts: &[String]) -> Result<TlsFiles, String> {
        let fail = |e: rcgen::Error| format!("generating certificates: {e}");
        let ca_key = KeyPair::generate().map_err(fail)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Herder throwaway CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(fail)?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let node_key = KeyPair::generate().map_err(fail)?;
        let mut params = CertificateParams::new(hosts.to_vec()).map_err(fail)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Herder node");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let node_cert = params.signed_by(&node_key, &issuer).map_err(fail)?;

        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write = |name: &str, text: &str, private: bool| -> Result<std::path::PathBuf, String> {
            let path = dir.join(name);
            write_file(&path, text, private).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        };
        let ca = write(CA_FILE, &ca_cert.pem(), false)?;
        let cert = write(CERT_FILE, &node_cert.pem(), false)?;
        let key = write(KEY_FILE, &node_key.serialize_pem(), true)?;
        Ok(TlsFiles {
            cert,
            key,
            ca: Some(ca),
        })
    }

    fn write_file(path: &Path, text: &str, private: bool) -> std::io::Result<()> {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        #[cfg(not(unix))]
        let _ = private;
        let mut file = options.open(path)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_name_is_the_host_of_the_address() {
        assert_eq!(
            server_name("127.0.0.1:7071"),
            Ok(ServerName::IpAddress(
                "127.0.0.1".parse::<IpAddr>().expect("ip").into()
            ))
        );
        assert_eq!(
            server_name("[::1]:7071"),
            Ok(ServerName::IpAddress(
                "::1".parse::<IpAddr>().expect("ip").into()
            ))
        );
        assert_eq!(
            server_name("herder-0.herder-peer:7072"),
            Ok(ServerName::try_from("herder-0.herder-peer".to_owned()).expect("dns"))
        );
        assert!(server_name("bad host:1").is_err());
    }

    #[test]
    fn files_that_do_not_fit_together_are_refused_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("herder-tls-unit-{}", std::process::id()));
        let files = throwaway::write(&dir, &["localhost".to_owned()]).expect("generate");
        assert!(ServerTls::load(files.clone()).is_ok());
        // A key from another pair does not fit the certificate.
        let other = dir.join("other");
        let stranger = throwaway::write(&other, &["localhost".to_owned()]).expect("generate");
        let mismatched = TlsFiles {
            key: stranger.key.clone(),
            ..files.clone()
        };
        let error = ServerTls::load(mismatched).expect_err("a key of another certificate");
        assert!(error.to_string().contains("node-key.pem"), "{error}");
        // A certificate file with no certificate in it.
        let empty = TlsFiles {
            cert: files.key.clone(),
            ..files.clone()
        };
        let error = ServerTls::load(empty).expect_err("no certificate");
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
