//! The credentials themselves: shared secrets, client tokens and the roles tokens carry.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::limits::{CREDENTIAL_BYTES_MAX, CREDENTIAL_BYTES_MIN, TOKENS_MAX, TOKEN_NAME_BYTES_MAX};
use crate::protocol::ClientRequest;

/// What a client's token allows. Each role allows everything the roles below it allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read jobs, workers and the group.
    Reader,
    /// Also submit jobs and cancel them.
    Submitter,
    /// Also purge finished jobs and move leadership.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Reader, Role::Submitter, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Submitter => "submitter",
            Role::Admin => "admin",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == text)
    }

    /// The least role that may make `request`.
    pub fn needed_for(request: &ClientRequest) -> Role {
        match request {
            ClientRequest::Status { .. }
            | ClientRequest::Wait { .. }
            | ClientRequest::List { .. }
            | ClientRequest::Workers { .. }
            | ClientRequest::Queues { .. }
            | ClientRequest::Cluster { .. } => Role::Reader,
            ClientRequest::Submit { .. }
            | ClientRequest::SubmitBatch { .. }
            | ClientRequest::Cancel { .. } => Role::Submitter,
            ClientRequest::TransferLeader { .. }
            | ClientRequest::Purge { .. }
            | ClientRequest::SetQueue { .. } => Role::Admin,
        }
    }

    /// Whether this role may make `request`.
    pub fn permits(self, request: &ClientRequest) -> bool {
        self >= Role::needed_for(request)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is on the other end of a client connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The token's name; `None` when the port checks no tokens.
    pub name: Option<String>,
    pub role: Role,
}

impl Caller {
    /// Anyone at all, on a port that checks no tokens: everything is allowed, as before tokens.
    pub fn anonymous() -> Caller {
        Caller {
            name: None,
            role: Role::Admin,
        }
    }

    /// How logs and errors name the caller.
    pub fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("token {name:?} ({})", self.role),
            None => format!("an anonymous caller ({})", self.role),
        }
    }
}

/// Which shared secret a challenge-response proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretLink {
    Worker,
    Peer,
}

impl SecretLink {
    pub fn as_str(self) -> &'static str {
        match self {
            SecretLink::Worker => "worker",
            SecretLink::Peer => "peer",
        }
    }
}

/// Why a secret or a tokens file was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("is {len} bytes; a secret or token must have at least {CREDENTIAL_BYTES_MIN} (make one with `head -c 32 /dev/urandom | base64`)")]
    TooShort { len: usize },
    #[error("is {len} bytes; a secret or token may have at most {CREDENTIAL_BYTES_MAX}")]
    TooLong { len: usize },
    #[error("may hold only printable ASCII without spaces")]
    BadCharacter,
}

/// A shared secret (the worker secret or the peer secret). Its `Debug` never shows it, and it
/// has no `==`: a secret is compared only through a proof, in constant time.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret from a file's text: surrounding whitespace (the final newline) is dropped, and
    /// what remains must be 24 to 512 printable ASCII characters.
    pub fn from_text(text: &str) -> Result<Secret, CredentialError> {
        let secret = text.trim();
        check_credential(secret)?;
        Ok(Secret(secret.as_bytes().to_vec()))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether two secrets are the same, compared in constant time (for refusing one secret
    /// used for two ports).
    pub fn same_as(&self, other: &Secret) -> bool {
        constant_time_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

fn check_credential(text: &str) -> Result<(), CredentialError> {
    let len = text.len();
    if len < CREDENTIAL_BYTES_MIN {
        return Err(CredentialError::TooShort { len });
    }
    if len > CREDENTIAL_BYTES_MAX {
        return Err(CredentialError::TooLong { len });
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CredentialError::BadCharacter);
    }
    Ok(())
}

/// Why a tokens file was refused, with the line (from 1) that says so.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokensError {
    #[error("line {line}: expected `NAME ROLE TOKEN`, found {fields} field(s)")]
    Fields { line: usize, fields: usize },
    #[error("line {line}: the name must be 1 to {TOKEN_NAME_BYTES_MAX} letters, digits, '-', '_', '.' or '@'")]
    BadName { line: usize },
    #[error("line {line}: unknown role {role:?} (admin, submitter or reader)")]
    BadRole { line: usize, role: String },
    #[error("line {line}: the token {error}")]
    BadToken { line: usize, error: CredentialError },
    #[error("line {line}: the name {name:?} has another role on line {first}; one name, one role")]
    NameRoles {
        line: usize,
        first: usize,
        name: String,
    },
    #[error("line {line}: the token is already used on line {first}")]
    DuplicateToken { line: usize, first: usize },
    #[error("more than {TOKENS_MAX} tokens")]
    TooMany,
}

#[derive(Clone)]
struct TokenEntry {
    name: String,
    role: Role,
    digest: [u8; 32],
    line: usize,
}

/// The client tokens a coordinator accepts, parsed from a tokens file: one `NAME ROLE TOKEN` a
/// line, blank lines and lines starting with `#` ignored. Only the tokens' digests are kept.
#[derive(Clone, Default)]
pub struct TokenTable {
    entries: Vec<TokenEntry>,
}

impl fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| (&e.name, e.role)))
            .finish()
    }
}

impl TokenTable {
    pub fn parse(text: &str) -> Result<TokenTable, TokensError> {
        let mut entries: Vec<TokenEntry> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            let [name, role, token] = fields[..] else {
                return Err(TokensError::Fields {
                    line,
                    fields: fields.len(),
                });
            };
            if !valid_name(name) {
                return Err(TokensError::BadName { line });
            }
            let role = Role::parse(role).ok_or_else(|| TokensError::BadRole {
                line,
                role: role.chars().take(32).collect(),
            })?;
            check_credential(token).map_err(|error| TokensError::BadToken { line, error })?;
            let digest = digest(token);
            // A name may have several tokens (an old and a new one, while clients move), all
            // with one role: the jobs and keys of the name are the same whichever is used.
            if let Some(first) = entries.iter().find(|e| e.name == name && e.role != role) {
                return Err(TokensError::NameRoles {
                    line,
                    first: first.line,
                    name: name.to_owned(),
                });
            }
            if let Some(first) = entries.iter().find(|e| e.digest == digest) {
                return Err(TokensError::DuplicateToken {
                    line,
                    first: first.line,
                });
            }
            if entries.len() == TOKENS_MAX {
                return Err(TokensError::TooMany);
            }
            entries.push(TokenEntry {
                name: name.to_owned(),
                role,
                digest,
                line,
            });
        }
        Ok(TokenTable { entries })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Who `token` names, if anyone. Every entry is compared, in constant time, whether or not
    /// an earlier one matched, so the time taken says nothing about which entry (if any) did.
    pub fn lookup(&self, token: &str) -> Option<Caller> {
        let wanted = digest(token);
        let mut found: Option<&TokenEntry> = None;
        for entry in &self.entries {
            if constant_time_eq(&entry.digest, &wanted) {
                found = Some(entry);
            }
        }
        found.map(|entry| Caller {
            name: Some(entry.name.clone()),
            role: entry.role,
        })
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TOKEN_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal lengths and equal bytes, in time that depends only on the length.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut difference = 0u8;
    for (x, y) in a.iter().zip(b) {
        difference |= x ^ y;
    }
    // Keep the optimizer from turning the loop into an early-exit comparison.
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const TOKEN_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn a_tokens_file_maps_each_token_to_its_name_and_role() {
        let table = TokenTable::parse(&format!(
            "# operators\n\nops admin {TOKEN_A}\n  ci-bot   submitter {TOKEN_B}  \n"
        ))
        .expect("a valid file");
        assert_eq!(table.len(), 2);
        assert_eq!(
            table.lookup(TOKEN_A),
            Some(Caller {
                name: Some("ops".into()),
                role: Role::Admin
            })
        );
        assert_eq!(table.lookup(TOKEN_B).map(|c| c.role), Some(Role::Submitter));
        assert_eq!(table.lookup("cccccccccccccccccccccccccccc"), None);
        assert_eq!(table.lookup(""), None);
    }

    #[test]
    fn every_mistake_in_a_tokens_file_names_its_line() {
        let cases = [
            (
                format!("ops admin {TOKEN_A} extra"),
                TokensError::Fields { line: 1, fields: 4 },
            ),
            (
                format!("\nops root {TOKEN_A}"),
                TokensError::BadRole {
                    line: 2,
                    role: "root".into(),
                },
            ),
            (
                "ops admin short".to_owned(),
                TokensError::BadToken {
                    line: 1,
                    error: CredentialError::TooShort { len: 5 },
                },
            ),
            (
                format!("op$ admin {TOKEN_A}"),
                TokensError::BadName { line: 1 },
            ),
            (
                format!("ops admin {TOKEN_A}\nops reader {TOKEN_B}"),
                TokensError::NameRoles {
                    line: 2,
                    first: 1,
                    name: "ops".into(),
                },
            ),
            (
                format!("ops admin {TOKEN_A}\nci reader {TOKEN_A}"),
                TokensError::DuplicateToken { line: 2, first: 1 },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(TokenTable::parse(&text).err(), Some(expected), "{text}");
        }
    }

    #[test]
    fn a_name_may_hold_several_tokens_of_one_role_while_clients_move_to_a_new_one() {
        let table = TokenTable::parse(&format!("ci submitter {TOKEN_A}\nci submitter {TOKEN_B}\n"))
            .expect("two tokens of one name and role");
        assert_eq!(table.lookup(TOKEN_A), table.lookup(TOKEN_B));
        assert_eq!(
            table.lookup(TOKEN_B).and_then(|c| c.name).as_deref(),
            Some("ci")
        );
    }

    #[test]
    fn roles_allow_what_the_roles_below_them_allow() {
        use crate::ids::{JobId, RequestId};
        let status = ClientRequest::Status {
            request_id: RequestId(1),
            job_id: JobId(uuid::Uuid::from_u128(1)),
        };
        let cancel = ClientRequest::Cancel {
            request_id: RequestId(1),
            job_id: JobId(uuid::Uuid::from_u128(1)),
        };
        let purge = ClientRequest::Purge {
            request_id: RequestId(1),
            state: None,
            older_than_millis: 0,
        };
        assert!(Role::Reader.permits(&status));
        assert!(!Role::Reader.permits(&cancel));
        assert!(Role::Submitter.permits(&cancel));
        assert!(!Role::Submitter.permits(&purge));
        assert!(Role::Admin.permits(&purge));
    }

    #[test]
    fn secrets_are_trimmed_checked_and_never_printed() {
        // `Secret` has no `==`; its errors are compared instead.
        let secret = Secret::from_text(&format!("{TOKEN_A}\n")).expect("long enough");
        assert_eq!(secret.bytes(), TOKEN_A.as_bytes());
        assert!(!format!("{secret:?}").contains(TOKEN_A));
        assert_eq!(
            Secret::from_text("tiny").err(),
            Some(CredentialError::TooShort { len: 4 })
        );
        assert_eq!(
            Secret::from_text("aaaaaaaaaaaa aaaaaaaaaaaaaaa").err(),
            Some(CredentialError::BadCharacter)
        );
    }

    #[test]
    fn constant_time_eq_is_plain_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
