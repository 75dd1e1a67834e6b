//! `--peers ID=HOST:PORT,...`: the members of a coordinator group and where their peer ports
//! are, checked before anything starts.

use herder_core::ids::NodeId;

/// Longest member id accepted.
const NODE_ID_BYTES_MAX: usize = 64;

/// One `ID=HOST:PORT` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerEntry {
    pub id: NodeId,
    /// As written: a name, an IPv4 address, or an IPv6 address in brackets.
    pub host: String,
    pub port: u16,
}

impl PeerEntry {
    /// `host:port`, as the other members dial it.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The group `--peers` describes, from one member's side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// This member's own entry.
    pub me: PeerEntry,
    /// Every other member, in the order given.
    pub others: Vec<PeerEntry>,
}

/// A member id: letters, digits, `.`, `_` and `-`, at most 64 bytes. `what` names the flag.
pub fn parse_node_id(raw: &str, what: &str) -> Result<NodeId, String> {
    let valid = !raw.is_empty()
        && raw.len() <= NODE_ID_BYTES_MAX
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if valid {
        Ok(NodeId(raw.to_owned()))
    } else {
        Err(format!(
            "{what}: {raw:?} is not a member id (1 to {NODE_ID_BYTES_MAX} letters, digits, '.', '_' or '-')"
        ))
    }
}

/// Parses `--peers` for the member `me`. Refuses an entry that is not `ID=HOST:PORT`, an id
/// or address listed twice, and a list that does not name `me`.
pub fn parse_peers(raw: &str, me: &NodeId) -> Result<GroupSpec, String> {
    let mut entries: Vec<PeerEntry> = Vec::new();
    for (n, text) in raw.split(',').enumerate() {
        let entry = parse_entry(text.trim(), n + 1)?;
        if let Some(earlier) = entries.iter().find(|e| e.id == entry.id) {
            return Err(format!(
                "--peers names member {} twice ({} and {})",
                entry.id,
                earlier.address(),
                entry.address()
            ));
        }
        if let Some(earlier) = entries.iter().find(|e| e.address() == entry.address()) {
            return Err(format!(
                "--peers gives {} and {} the same address {}",
                earlier.id,
                entry.id,
                entry.address()
            ));
        }
        entries.push(entry);
    }
    let Some(position) = entries.iter().position(|e| e.id == *me) else {
        let ids: Vec<&str> = entries.iter().map(|e| e.id.0.as_str()).collect();
        return Err(format!(
            "--id {me} is not in --peers ({}): every member is given the same --peers, listing the whole group, itself included",
            ids.join(", ")
        ));
    };
    let me = entries.remove(position);
    Ok(GroupSpec {
        me,
        others: entries,
    })
}

fn parse_entry(text: &str, n: usize) -> Result<PeerEntry, String> {
    let shape = || format!("--peers entry {n} ({text:?}) is not ID=HOST:PORT");
    let (id, address) = text.split_once('=').ok_or_else(shape)?;
    let (host, port) = address.rsplit_once(':').ok_or_else(shape)?;
    let id = parse_node_id(id.trim(), &format!("--peers entry {n}"))?;
    let host = host.trim();
    let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    if host.is_empty()
        || host.chars().any(char::is_whitespace)
        || (host.contains(':') && !bracketed)
    {
        return Err(format!(
            "--peers entry {n} ({text:?}): {host:?} is not a host (an IPv6 address goes in brackets, e.g. [::1]:7072)"
        ));
    }
    let port = match port.trim().parse::<u16>() {
        Ok(port) if port > 0 => port,
        _ => {
            return Err(format!(
                "--peers entry {n} ({text:?}): {port:?} is not a port (1 to 65535)"
            ))
        }
    };
    Ok(PeerEntry {
        id,
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> NodeId {
        NodeId(s.to_owned())
    }

    #[test]
    fn the_whole_group_is_split_into_this_member_and_the_others() {
        let spec = parse_peers(
            "c1=10.0.0.1:7072, c2=node-2.local:7082,c3=[::1]:7092",
            &id("c2"),
        )
        .expect("valid");
        assert_eq!(spec.me.id, id("c2"));
        assert_eq!(spec.me.address(), "node-2.local:7082");
        let others: Vec<String> = spec.others.iter().map(PeerEntry::address).collect();
        assert_eq!(others, vec!["10.0.0.1:7072", "[::1]:7092"]);
    }

    #[test]
    fn a_group_of_one_may_list_only_itself() {
        let spec = parse_peers("c1=127.0.0.1:7072", &id("c1")).expect("valid");
        assert!(spec.others.is_empty());
    }

    #[test]
    fn bad_lists_are_refused_with_what_is_wrong() {
        let cases = [
            (
                "c1=127.0.0.1:7072,c2",
                "entry 2 (\"c2\") is not ID=HOST:PORT",
            ),
            ("c1=127.0.0.1:7072,", "entry 2 (\"\") is not ID=HOST:PORT"),
            ("c1=127.0.0.1", "is not ID=HOST:PORT"),
            ("c1=127.0.0.1:http", "is not a port"),
            ("c1=127.0.0.1:0", "is not a port"),
            ("c1=127.0.0.1:70000", "is not a port"),
            ("c1=:7072", "is not a host"),
            ("c1=::1:7072", "goes in brackets"),
            ("c 1=127.0.0.1:7072", "is not a member id"),
            ("=127.0.0.1:7072", "is not a member id"),
            ("c1=a:1,c2=b:2,c1=c:3", "names member c1 twice"),
            ("c1=a:1,c2=a:1", "the same address a:1"),
            ("c2=a:1,c3=b:2", "--id c1 is not in --peers (c2, c3)"),
        ];
        for (raw, expected) in cases {
            match parse_peers(raw, &id("c1")) {
                Ok(spec) => panic!("{raw:?} was accepted: {spec:?}"),
                Err(message) => assert!(message.contains(expected), "{raw:?}: {message}"),
            }
        }
    }
}
