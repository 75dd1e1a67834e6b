//! The jobs of a batch file that wait for each other: a line may name itself (`"ref"`) and the
//! lines it waits for (`"after_refs"`). The file is checked whole before anything is sent (every
//! name known, none twice, no line waiting for itself, no cycle) and sent in waves: each wave
//! holds the lines whose jobs to wait for were all sent in earlier waves, so their ids are known.

use std::collections::BTreeMap;

/// One line's place in the graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// Its name, if other lines wait for it.
    pub name: Option<String>,
    /// The names of the lines it waits for.
    pub after: Vec<String>,
}

/// The lines (indexes into `nodes`) in waves, every line after the lines it waits for; or what
/// is wrong with the graph, naming the line (`lines[i]` is the file's line of node `i`).
pub fn waves(nodes: &[Node], lines: &[usize]) -> Result<Vec<Vec<usize>>, String> {
    let mut by_name = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        if let Some(name) = &node.name {
            if let Some(first) = by_name.insert(name.as_str(), i) {
                return Err(format!(
                    "line {}: the name {name:?} is taken by line {}",
                    lines[i], lines[first]
                ));
            }
        }
    }
    // How many lines each waits for, and who waits for each.
    let mut waiting = vec![0usize; nodes.len()];
    let mut dependents = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for name in &node.after {
            let Some(&parent) = by_name.get(name.as_str()) else {
                return Err(format!("line {}: no line is named {name:?}", lines[i]));
            };
            if parent == i {
                return Err(format!("line {}: it waits for itself", lines[i]));
            }
            waiting[i] += 1;
            dependents[parent].push(i);
        }
    }
    let mut waves = Vec::new();
    let mut ready: Vec<usize> = (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut placed = 0;
    while !ready.is_empty() {
        placed += ready.len();
        let mut next = Vec::new();
        for &i in &ready {
            for &child in &dependents[i] {
                waiting[child] -= 1;
                if waiting[child] == 0 {
                    next.push(child);
                }
            }
        }
        next.sort_unstable();
        waves.push(std::mem::replace(&mut ready, next));
    }
    if placed < nodes.len() {
        let stuck: Vec<String> = (0..nodes.len())
            .filter(|&i| waiting[i] > 0)
            .map(|i| lines[i].to_string())
            .collect();
        return Err(format!(
            "lines {} wait for each other in a cycle (or for a line that does)",
            stuck.join(", ")
        ));
    }
    Ok(waves)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, after: &[&str]) -> Node {
        Node {
            name: (!name.is_empty()).then(|| name.to_owned()),
            after: after.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn a_diamond_goes_in_three_waves_in_file_order_within_each() {
        let nodes = [
            node("join", &["left", "right"]),
            node("left", &["root"]),
            node("", &[]),
            node("right", &["root"]),
            node("root", &[]),
        ];
        let lines = [1, 2, 3, 4, 5];
        assert_eq!(
            waves(&nodes, &lines),
            Ok(vec![vec![2, 4], vec![1, 3], vec![0]])
        );
    }

    #[test]
    fn a_cycle_an_unknown_name_a_taken_name_and_a_self_reference_are_refused() {
        let lines = [10, 11, 12];
        let cycle = [node("a", &["c"]), node("b", &["a"]), node("c", &["b"])];
        let err = waves(&cycle, &lines).expect_err("a cycle");
        assert!(err.contains("10, 11, 12") && err.contains("cycle"), "{err}");
        let unknown = [node("a", &["nobody"])];
        assert!(waves(&unknown, &lines)
            .expect_err("unknown")
            .contains("\"nobody\""));
        let taken = [node("a", &[]), node("a", &[])];
        assert!(waves(&taken, &lines)
            .expect_err("taken")
            .contains("line 11"));
        let itself = [node("a", &["a"])];
        assert!(waves(&itself, &lines).expect_err("self").contains("itself"));
    }
}
