//! Credentials from the command line: the files they live in, the token a client presents, and
//! the rule that a port reachable from other machines must check who connects.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use herder_core::auth::{ClientToken, Secret, TokenTable};
use herder_runtime::auth::{ServerCredentials, Tokens};
use herder_runtime::tls::{ClientTls, ServerTls, TlsFiles};

/// The environment variable a client's token may come from (when --token-file is not given).
pub const TOKEN_ENV: &str = "HERDER_TOKEN";
/// Largest credential file read (a tokens file of `TOKENS_MAX` long lines fits).
const CREDENTIAL_FILE_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// What a coordinator checks on each port.
#[derive(Args, Debug, Clone, Default)]
pub struct ServerAuthArgs {
    /// File holding the secret the members of the group prove to each other (24 to 512
    /// printable characters; the same file on every member).
    #[arg(long, value_name = "FILE")]
    pub peer_secret_file: Option<PathBuf>,
    /// File holding the secret workers prove on the worker port (the same file on every
    /// worker and member).
    #[arg(long, value_name = "FILE")]
    pub worker_secret_file: Option<PathBuf>,
    /// File of client tokens, one `NAME ROLE TOKEN` a line (roles: admin, submitter, reader;
    /// `#` starts a comment). Checked on the client port and the HTTP API; re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub client_tokens_file: Option<PathBuf>,
    /// Let ports that check no credentials listen beyond loopback. Anyone who reaches them can
    /// then do anything; for a network you trust entirely.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// PEM file of this member's certificate (then any intermediates): every port then speaks
    /// TLS, the HTTP port HTTPS. Re-read on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the certificate's private key.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM file of the CA that issued every member's certificate: the peer link is mutual TLS,
    /// each member checking the others against it (required with --tls-cert in a group).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
}

/// How a worker or client checks the coordinator it speaks TLS to.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientTlsArgs {
    /// Speak TLS to the coordinators, trusting the CA certificates in this PEM file.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Speak TLS to the coordinators, trusting the system's CA certificates.
    #[arg(long, global = true)]
    pub tls: bool,
}

impl ClientTlsArgs {
    pub fn load(&self) -> Result<Option<ClientTls>, String> {
        match (&self.tls_ca, self.tls) {
            (Some(path), _) => ClientTls::with_ca_file(path).map(Some),
            (None, true) => ClientTls::with_system_roots().map(Some),
            (None, false) => Ok(None),
        }
        .map_err(|e| e.to_string())
    }
}

/// Reads a credential file, bounded, naming the file in every error.
fn read(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(CREDENTIAL_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > CREDENTIAL_FILE_BYTES_MAX {
        return Err(format!(
            "{}: larger than {CREDENTIAL_FILE_BYTES_MAX} bytes",
            path.display()
        ));
    }
    Ok(text)
}

pub fn read_secret(path: &Path) -> Result<Arc<Secret>, String> {
    let text = read(path)?;
    Secret::from_text(&text)
        .map(Arc::new)
        .map_err(|e| format!("{}: the secret {e}", path.display()))
}

/// A tokens file's table; one that lists no token is refused, since nobody could use the port.
pub fn read_tokens(path: &Path) -> Result<TokenTable, String> {
    let text = read(path)?;
    let table = TokenTable::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if table.is_empty() {
        return Err(format!(
            "{}: no tokens; nobody could use the client port",
            path.display()
        ));
    }
    Ok(table)
}

impl ServerAuthArgs {
    /// The credentials these flags name, read and checked.
    pub fn load(&self) -> Result<ServerCredentials, String> {
        let secret = |path: &Option<PathBuf>| path.as_deref().map(read_secret).transpose();
        let client_tokens = match &self.client_tokens_file {
            None => None,
            Some(path) => Some(Tokens::new(read_tokens(path)?)),
        };
        let worker_secret = secret(&self.worker_secret_file)?;
        let peer_secret = secret(&self.peer_secret_file)?;
        if let (Some(worker), Some(peer)) = (&worker_secret, &peer_secret) {
            // Each port its own credential: a worker host must not hold the group's secret.
            if worker.same_as(peer) {
                return Err(
                    "--worker-secret-file and --peer-secret-file hold the same secret; give the group its own, which no worker host holds".to_owned(),
                );
            }
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(
                ServerTls::load(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    ca: self.tls_ca.clone(),
                })
                .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        Ok(ServerCredentials {
            worker_secret,
            peer_secret,
            client_tokens,
            tls,
        })
    }

    /// Refuses to expose a port that checks nobody, unless `--insecure-no-auth` says so (then
    /// each such port is warned about, at every start).
    /// `ports`: each port's flag, its address (if it listens) and whether it checks a
    /// credential.
    pub fn check_exposure(&self, ports: &[(&str, Option<SocketAddr>, bool)]) -> Result<(), String> {
        for (flag, addr, checked) in ports {
            let Some(addr) = addr else { continue };
            if addr.ip().is_loopback() || *checked {
                continue;
            }
            if !self.insecure_no_auth {
                return Err(format!(
                    "{flag} listens on {addr}, beyond this machine, but nothing checks who connects there; give the port its credential ({}), or --insecure-no-auth for a network you trust entirely",
                    needed_flag(flag)
                ));
            }
            tracing::warn!(
                %addr,
                port = flag,
                "INSECURE: listening beyond this machine with no credential (--insecure-no-auth): anyone who reaches this port can submit and cancel jobs or pose as a worker or a member"
            );
        }
        Ok(())
    }
}

fn needed_flag(port_flag: &str) -> &'static str {
    match port_flag {
        "--worker-port" => "--worker-secret-file",
        "--peer-port" => "--peer-secret-file",
        _ => "--client-tokens-file",
    }
}

/// A client's token: `--token-file`, else `HERDER_TOKEN`, else none.
pub fn client_token(token_file: Option<&Path>) -> Result<Option<Arc<ClientToken>>, String> {
    let (text, source) = match token_file {
        Some(path) => (read(path)?, path.display().to_string()),
        None => match std::env::var(TOKEN_ENV) {
            Ok(text) => (text, TOKEN_ENV.to_owned()),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("{TOKEN_ENV} is not valid text"))
            }
        },
    };
    ClientToken::from_text(&text)
        .map(|token| Some(Arc::new(token)))
        .map_err(|e| format!("{source}: the token {e}"))
}

/// On every SIGHUP, re-reads the tokens file (see [`reload`]) and the TLS files, each whole or
/// not at all.
pub fn reload_on_hangup(tokens: Option<(PathBuf, Tokens)>, tls: Option<ServerTls>) {
    if tokens.is_none() && tls.is_none() {
        return;
    }
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; credentials will not be reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            if let Some((path, tokens)) = &tokens {
                match reload(path, tokens) {
                    Ok(count) => {
                        tracing::info!(file = %path.display(), tokens = count, "Client tokens reloaded")
                    }
                    Err(error) => tracing::error!(
                        %error,
                        "Client tokens not reloaded; the old ones stay in force"
                    ),
                }
            }
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => tracing::info!(
                        cert = %tls.files().cert.display(),
                        "TLS certificate reloaded; new connections use it"
                    ),
                    Err(error) => tracing::error!(
                        %error,
                        "TLS files not reloaded; the old certificate stays in force"
                    ),
                }
            }
        }
    });
}

/// Replaces the table new connections are checked against with the file's, and says how many
/// tokens it holds; a file that does not parse, or lists none, changes nothing.
pub fn reload(path: &Path, tokens: &Tokens) -> Result<usize, String> {
    let table = read_tokens(path)?;
    let count = table.len();
    tokens.replace(table);
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old-token-for-reload-tests-0123456789";
    const NEW: &str = "new-token-for-reload-tests-0123456789";

    #[test]
    fn a_reload_takes_a_good_file_whole_and_leaves_a_bad_one_alone() {
        let path = std::env::temp_dir().join(format!("herder-reload-{}", std::process::id()));
        let tokens = Tokens::new(TokenTable::parse(&format!("old reader {OLD}\n")).expect("valid"));
        for bad in [
            format!("new admin {NEW}\nbroken line\n"),
            "# nothing\n".to_owned(),
        ] {
            std::fs::write(&path, bad).expect("write");
            assert!(reload(&path, &tokens).is_err());
            assert!(
                tokens.current().lookup(OLD).is_some(),
                "the old token stays"
            );
            assert!(
                tokens.current().lookup(NEW).is_none(),
                "nothing of a bad file is taken"
            );
        }
        std::fs::write(&path, format!("new admin {NEW}\n")).expect("write");
        assert_eq!(reload(&path, &tokens), Ok(1));
        assert!(tokens.current().lookup(NEW).is_some());
        assert!(
            tokens.current().lookup(OLD).is_none(),
            "a token gone from the file is gone"
        );
        let _ = std::fs::remove_file(&path);
    }
}
