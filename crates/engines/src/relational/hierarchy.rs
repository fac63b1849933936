//! Generalization hierarchies of categorical quasi-identifiers, in ARX's format: one line per leaf,
//! `value;level1;level2;...;*`, `;`-separated (or `,`-separated when the first line holds no `;`),
//! no header. This is the one place hierarchy lookup lives.
//!
//! Invariants (checked by [`Hierarchy::parse`], each failure names the source, line and rule):
//! every line has the same number of levels (at least 2); leaves are unique; the hierarchy is a tree
//! (a label at level i always has the same parent at level i+1); all lines end in one single root.
//! Levels are numbered from 0 (the leaf) to `height() - 1` (the root). Nodes are identified by
//! (level, label), so the same label may appear at different levels.
use crate::text::quote;
use std::collections::HashMap;

/// Index of a node of a hierarchy.
pub type NodeId = u32;
/// Index of a leaf (a value that may occur in the table), 0..leaf_count().
pub type LeafId = u32;

/// A parsed generalization hierarchy.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    height: usize,
    leaf_count: usize,
    /// Node labels, by node id.
    labels: Vec<String>,
    /// Level of each node.
    levels: Vec<u8>,
    /// `ancestors[level * leaf_count + leaf]`: the leaf's ancestor at `level` (level 0 is the leaf node).
    ancestors: Vec<NodeId>,
    /// Keyed by the caller's values: a randomly seeded hasher.
    leaf_by_value: HashMap<String, LeafId, foldhash::fast::RandomState>,
    /// Number of leaves below each node.
    leaves_under: Vec<u32>,
    /// Index of each node among its parent's children (0 for the root).
    child_rank: Vec<u32>,
    /// Number of children of each node.
    child_count: Vec<u32>,
}

/// Why a hierarchy file was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HierarchyError {
    #[error("{source_name}: hierarchy is empty (rule: one line per leaf, `value;level1;...;*`)")]
    Empty { source_name: String },
    #[error(
        "{source_name}:{line}: {found} levels, but line {first_line} has {expected} (rule: every line of a hierarchy has the same depth)"
    )]
    InconsistentDepth {
        source_name: String,
        line: usize,
        found: usize,
        expected: usize,
        first_line: usize,
    },
    #[error(
        "{source_name}:{line}: only {found} level (rule: a hierarchy line is `value;...;*` with at least 2 levels)"
    )]
    TooShallow {
        source_name: String,
        line: usize,
        found: usize,
    },
    #[error(
        "{source_name}:{line}:{column}: empty label (rule: hierarchy labels must not be empty)"
    )]
    EmptyLabel {
        source_name: String,
        line: usize,
        column: usize,
    },
    #[error(
        "{source_name}:{line}: leaf {} already defined on line {first_line} (rule: leaves are unique)",
        quote(.value)
    )]
    DuplicateLeaf {
        source_name: String,
        line: usize,
        value: String,
        first_line: usize,
    },
    #[error(
        "{source_name}:{line}:{column}: {} has parent {} here but {} on line {first_line} (rule: a hierarchy is a tree)",
        quote(.label),
        quote(.parent),
        quote(.first_parent)
    )]
    NotATree {
        source_name: String,
        line: usize,
        column: usize,
        label: String,
        parent: String,
        first_parent: String,
        first_line: usize,
    },
    #[error(
        "{source_name}:{line}:{column}: root {} differs from {} of line 1 (rule: a hierarchy has one root)",
        quote(.root),
        quote(.first_root)
    )]
    SeveralRoots {
        source_name: String,
        line: usize,
        column: usize,
        root: String,
        first_root: String,
    },
}

/// The separator of a hierarchy file: `;` (ARX's export) when its first non-empty line holds one,
/// else `,` when it holds one (a plain CSV), else `;` (a one-level file).
fn separator_of(text: &str) -> char {
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    if !first.contains(';') && first.contains(',') {
        ','
    } else {
        ';'
    }
}

impl Hierarchy {
    /// Parses ARX hierarchy text. `source_name` (usually the file path) is used in error messages.
    pub fn parse(source_name: &str, text: &str) -> Result<Hierarchy, HierarchyError> {
        let separator = separator_of(text);
        let mut lines: Vec<(usize, Vec<&str>)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(separator).map(str::trim).collect();
            lines.push((i + 1, fields));
        }
        let Some((first_line, first)) = lines.first() else {
            return Err(HierarchyError::Empty {
                source_name: source_name.to_string(),
            });
        };
        let height = first.len();
        let first_line = *first_line;
        let root = first[height - 1].to_string();
        let mut node_by_key: HashMap<(usize, &str), (NodeId, usize)> = HashMap::new();
        let mut labels: Vec<String> = Vec::new();
        let mut levels = Vec::new();
        let mut parent_of: Vec<Option<NodeId>> = Vec::new();
        let mut leaf_by_value: HashMap<String, LeafId, foldhash::fast::RandomState> =
            HashMap::default();
        let mut leaf_lines: Vec<usize> = Vec::new();
        let mut leaf_paths: Vec<Vec<NodeId>> = Vec::new();
        for (line, fields) in &lines {
            let line = *line;
            if fields.len() < 2 {
                return Err(HierarchyError::TooShallow {
                    source_name: source_name.to_string(),
                    line,
                    found: fields.len(),
                });
            }
            if fields.len() != height {
                return Err(HierarchyError::InconsistentDepth {
                    source_name: source_name.to_string(),
                    line,
                    found: fields.len(),
                    expected: height,
                    first_line,
                });
            }
            if let Some(column) = fields.iter().position(|f| f.is_empty()) {
                return Err(HierarchyError::EmptyLabel {
                    source_name: source_name.to_string(),
                    line,
                    column: column + 1,
                });
            }
            if fields[height - 1] != root {
                return Err(HierarchyError::SeveralRoots {
                    source_name: source_name.to_string(),
                    line,
                    column: height,
                    root: fields[height - 1].to_string(),
                    first_root: root.clone(),
                });
            }
            if let Some(&leaf) = leaf_by_value.get(fields[0]) {
                return Err(HierarchyError::DuplicateLeaf {
                    source_name: source_name.to_string(),
                    line,
                    value: fields[0].to_string(),
                    first_line: leaf_lines[leaf as usize],
                });
            }
            // Intern the path from the root down, checking that each node keeps its parent.
            let mut path = vec![0 as NodeId; height];
            let mut parent: Option<NodeId> = None;
            for level in (0..height).rev() {
                let label = fields[level];
                let node = match node_by_key.get(&(level, label)) {
                    Some(&(node, node_line)) => {
                        if parent_of[node as usize] != parent {
                            let name = |n: Option<NodeId>| {
                                n.map(|n| labels[n as usize].clone()).unwrap_or_default()
                            };
                            return Err(HierarchyError::NotATree {
                                source_name: source_name.to_string(),
                                line,
                                column: level + 1,
                                label: label.to_string(),
                                parent: name(parent),
                                first_parent: name(parent_of[node as usize]),
                                first_line: node_line,
                            });
                        }
                        node
                    }
                    None => {
                        let node = labels.len() as NodeId;
                        labels.push(label.to_string());
                        levels.push(level as u8);
                        parent_of.push(parent);
                        node_by_key.insert((level, label), (node, line));
                        node
                    }
                };
                path[level] = node;
                parent = Some(node);
            }
            leaf_by_value.insert(fields[0].to_string(), leaf_paths.len() as LeafId);
            leaf_lines.push(line);
            leaf_paths.push(path);
        }
        let leaf_count = leaf_paths.len();
        let mut ancestors = vec![0; height * leaf_count];
        let mut leaves_under = vec![0u32; labels.len()];
        for (leaf, path) in leaf_paths.iter().enumerate() {
            for (level, &node) in path.iter().enumerate() {
                ancestors[level * leaf_count + leaf] = node;
                leaves_under[node as usize] += 1;
            }
        }
        let mut child_count = vec![0u32; labels.len()];
        let mut child_rank = vec![0u32; labels.len()];
        for (node, parent) in parent_of.iter().enumerate() {
            if let Some(p) = parent {
                child_rank[node] = child_count[*p as usize];
                child_count[*p as usize] += 1;
            }
        }
        Ok(Hierarchy {
            height,
            leaf_count,
            labels,
            levels,
            ancestors,
            leaf_by_value,
            leaves_under,
            child_rank,
            child_count,
        })
    }

    /// Number of levels, leaf and root included.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Number of nodes, leaves included (node ids are `0..node_count()`).
    pub fn node_count(&self) -> usize {
        self.labels.len()
    }

    /// Number of leaves (values that may occur in the table).
    pub fn leaf_count(&self) -> usize {
        self.leaf_count
    }

    /// The leaf of a table value, if the hierarchy has it.
    pub fn leaf(&self, value: &str) -> Option<LeafId> {
        self.leaf_by_value.get(value).copied()
    }

    /// The ancestor of `leaf` at `level` (level 0 is the leaf's own node).
    pub fn ancestor(&self, leaf: LeafId, level: usize) -> NodeId {
        self.ancestors[level * self.leaf_count + leaf as usize]
    }

    /// The label of a node (for a leaf node, the value itself).
    pub fn label(&self, node: NodeId) -> &str {
        &self.labels[node as usize]
    }

    /// The level of a node (0 = leaf).
    pub fn level(&self, node: NodeId) -> usize {
        self.levels[node as usize] as usize
    }

    /// Number of leaves below (or at) a node.
    pub fn leaves_under(&self, node: NodeId) -> u32 {
        self.leaves_under[node as usize]
    }

    /// Number of children of a node.
    pub fn child_count(&self, node: NodeId) -> u32 {
        self.child_count[node as usize]
    }

    /// Index of a node among its parent's children.
    pub fn child_rank(&self, node: NodeId) -> u32 {
        self.child_rank[node as usize]
    }

    /// The lowest common ancestor of some leaves, with its level; `None` for no leaves.
    pub fn lowest_common_ancestor(
        &self,
        leaves: impl IntoIterator<Item = LeafId>,
    ) -> Option<(usize, NodeId)> {
        let mut leaves = leaves.into_iter();
        let first = leaves.next()?;
        let mut level = 0;
        for leaf in leaves {
            if leaf == first {
                continue;
            }
            while self.ancestor(leaf, level) != self.ancestor(first, level) {
                level += 1;
            }
        }
        Some((level, self.ancestor(first, level)))
    }

    /// Whether `node` is `leaf` or one of its ancestors.
    pub fn covers(&self, node: NodeId, leaf: LeafId) -> bool {
        let level = self.level(node);
        self.ancestor(leaf, level) == node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKCLASS: &str = "Private;Non-Government;*\nSelf-emp;Non-Government;*\nState-gov;Government;*\nFederal-gov;Government;*\nWithout-pay;Unemployed;*\n";

    #[test]
    fn parses_arx_format() {
        let h = Hierarchy::parse("w.csv", WORKCLASS).unwrap();
        assert_eq!(h.height(), 3);
        assert_eq!(h.leaf_count(), 5);
        let private = h.leaf("Private").unwrap();
        let state = h.leaf("State-gov").unwrap();
        let fed = h.leaf("Federal-gov").unwrap();
        assert_eq!(h.label(h.ancestor(private, 1)), "Non-Government");
        let (level, node) = h.lowest_common_ancestor([state, fed]).unwrap();
        assert_eq!((level, h.label(node)), (1, "Government"));
        let (level, node) = h.lowest_common_ancestor([state, private]).unwrap();
        assert_eq!((level, h.label(node)), (2, "*"));
        assert_eq!(h.leaves_under(node), 5);
        assert_eq!(h.child_count(node), 3);
        assert!(h.covers(node, private));
        assert!(!h.covers(h.ancestor(state, 1), private));
        assert_eq!(h.leaf("Never-worked"), None);
    }

    #[test]
    fn a_comma_separated_file_reads_like_the_semicolon_one() {
        let semicolons = Hierarchy::parse("w.csv", WORKCLASS).unwrap();
        let commas = Hierarchy::parse("w.csv", &WORKCLASS.replace(';', ",")).unwrap();
        for value in [
            "Private",
            "Self-emp",
            "State-gov",
            "Federal-gov",
            "Without-pay",
        ] {
            let (a, b) = (semicolons.leaf(value).unwrap(), commas.leaf(value).unwrap());
            for level in 0..3 {
                assert_eq!(
                    semicolons.label(semicolons.ancestor(a, level)),
                    commas.label(commas.ancestor(b, level))
                );
            }
        }
        // A `;` file keeps commas inside its labels.
        let h = Hierarchy::parse("h.csv", "a,b;x;*\nc;x;*\n").unwrap();
        assert_eq!(h.label(h.ancestor(h.leaf("a,b").unwrap(), 1)), "x");
    }

    #[test]
    fn rejects_malformed_hierarchies() {
        let err = |t: &str| Hierarchy::parse("h.csv", t).unwrap_err().to_string();
        assert!(err("a;x;*\nb;*\n").contains("h.csv:2: 2 levels"));
        assert!(err("").contains("empty"));
        assert!(err("a;x;*\na;y;*\n").contains("already defined on line 1"));
        assert!(err("a;x;*\nb;x;+\n").contains("one root"));
        assert!(err("a;x;p;*\nb;x;q;*\n").contains("is a tree"));
        assert!(err("a\n").contains("at least 2"));
        assert!(err("a;;*\n").contains("h.csv:1:2: empty label"));
    }
}
