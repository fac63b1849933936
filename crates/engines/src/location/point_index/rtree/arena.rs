//! One R-tree of points with reach boxes, in an arena of fixed-size nodes (the building block of
//! [`super::RTreeIndex`]).
//!
//! Invariants (checked by [`Tree::check`] in the tests):
//! - every node but the root holds between [`MIN_FILL`] and [`MAX_FILL`] entries; the root holds at
//!   most [`MAX_FILL`], and at least two when it is not a leaf; all leaves are at the same depth;
//! - an entry of a leaf is one point (its box is the point) with its reach box and slot; an entry of
//!   an inner node is a child with the bounding box of the child's points and the union of the
//!   child's reach boxes, both exact (never larger than the child's entries need);
//! - `parent` and `pos` of every non-root node name the entry that points at it; the slot map
//!   ([`Locs`]) names, for every slot in the tree, its leaf and position there, and nothing else;
//! - nodes not in the tree are on the free list and reused before the arena grows.
//!
//! Updates, one point at a time, never rebuild: an insertion descends by least enlargement of the
//! points' box plus the reach union (so points that reach alike share nodes, and the reach unions
//! prune; measured better than the points' box alone on the log-uniform workload) and splits a full node along the axis and at the position R* chooses (least margin,
//! then least overlap, then least area); a removal finds its leaf from the slot map (no descent),
//! swap-removes the entry, and either refreshes the boxes up the path or, when the leaf falls below
//! [`MIN_FILL`], takes it (and any ancestor that falls below in turn) out and reinserts its points
//! (Guttman's CondenseTree). Nothing depends on a clock or on randomness.
//!
//! A query walks the nodes from the root and opens a child only when the query box meets the
//! child's point box and (for an edge query) the query point lies in the child's reach union.
//! Nodes store their entries as arrays of coordinates (struct of arrays); a query tests all of a
//! node's entry slots at once without branching (the compiler vectorizes the comparisons over the
//! arrays) into a bit mask, masks off the slots past the node's length, and visits the set bits in
//! order. A leaf's test reads only the west and south arrays, its boxes being points.

/// Most entries of a node.
pub const MAX_FILL: usize = 16;

/// Fewest entries of a node other than the root; below it a node is dissolved and its points
/// reinserted.
pub const MIN_FILL: usize = 4;

/// Fewest entries either half of a split gets (R*'s 40 % of [`MAX_FILL`]).
const SPLIT_MIN: usize = 6;

/// `LIVE[len]`: the bit mask of a node's first `len` entry slots.
const LIVE: [u32; MAX_FILL + 1] = {
    let mut m = [0u32; MAX_FILL + 1];
    let mut i = 1;
    while i <= MAX_FILL {
        m[i] = m[i - 1] | (1 << (i - 1));
        i += 1;
    }
    m
};

/// No node / no parent.
const NONE: u32 = u32::MAX;

/// Where a slot's point is: its tree (of the index's trees), leaf and position in the leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub tree: u32,
    pub node: u32,
    pub pos: u32,
}

impl Loc {
    pub const NOWHERE: Loc = Loc {
        tree: NONE,
        node: NONE,
        pos: NONE,
    };
}

/// The slot map shared by the index's trees: slot -> where its point is.
pub type Locs = Vec<Loc>;

/// A box `[min_x, min_y, max_x, max_y]` (x = longitude, y = latitude, degrees).
pub type Rect = [f64; 4];

/// The empty box (the identity of [`union`]).
const EMPTY: Rect = [
    f64::INFINITY,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NEG_INFINITY,
];

#[inline]
fn union(a: &Rect, b: &Rect) -> Rect {
    [
        a[0].min(b[0]),
        a[1].min(b[1]),
        a[2].max(b[2]),
        a[3].max(b[3]),
    ]
}

#[inline]
fn area(r: &Rect) -> f64 {
    (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0)
}

#[inline]
fn margin(r: &Rect) -> f64 {
    (r[2] - r[0]).max(0.0) + (r[3] - r[1]).max(0.0)
}

#[inline]
fn overlap(a: &Rect, b: &Rect) -> f64 {
    let w = a[2].min(b[2]) - a[0].max(b[0]);
    let h = a[3].min(b[3]) - a[1].max(b[1]);
    if w > 0.0 && h > 0.0 { w * h } else { 0.0 }
}

/// One entry: a point (leaf) or a child's point box (inner node), the reach box or union, and the
/// slot (leaf) or child node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    pub rect: Rect,
    pub reach: Rect,
    pub child: u32,
}

/// A node: its entries as arrays of coordinates.
#[derive(Debug, Clone)]
struct Node {
    len: u32,
    leaf: bool,
    parent: u32,
    /// Position of this node's entry in its parent.
    pos: u32,
    x0: [f64; MAX_FILL],
    y0: [f64; MAX_FILL],
    x1: [f64; MAX_FILL],
    y1: [f64; MAX_FILL],
    rx0: [f64; MAX_FILL],
    ry0: [f64; MAX_FILL],
    rx1: [f64; MAX_FILL],
    ry1: [f64; MAX_FILL],
    child: [u32; MAX_FILL],
}

impl Node {
    fn new(leaf: bool) -> Node {
        Node {
            len: 0,
            leaf,
            parent: NONE,
            pos: NONE,
            x0: [0.0; MAX_FILL],
            y0: [0.0; MAX_FILL],
            x1: [0.0; MAX_FILL],
            y1: [0.0; MAX_FILL],
            rx0: [0.0; MAX_FILL],
            ry0: [0.0; MAX_FILL],
            rx1: [0.0; MAX_FILL],
            ry1: [0.0; MAX_FILL],
            child: [NONE; MAX_FILL],
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    fn get(&self, i: usize) -> Entry {
        Entry {
            rect: [self.x0[i], self.y0[i], self.x1[i], self.y1[i]],
            reach: [self.rx0[i], self.ry0[i], self.rx1[i], self.ry1[i]],
            child: self.child[i],
        }
    }

    #[inline]
    fn set(&mut self, i: usize, e: &Entry) {
        [self.x0[i], self.y0[i], self.x1[i], self.y1[i]] = e.rect;
        [self.rx0[i], self.ry0[i], self.rx1[i], self.ry1[i]] = e.reach;
        self.child[i] = e.child;
    }

    /// The union of the entries' point boxes and of their reach boxes.
    fn cover(&self) -> (Rect, Rect) {
        let (mut rect, mut reach) = (EMPTY, EMPTY);
        for i in 0..self.len() {
            let e = self.get(i);
            rect = union(&rect, &e.rect);
            reach = union(&reach, &e.reach);
        }
        (rect, reach)
    }
}

/// One R-tree (see the module doc).
#[derive(Debug, Clone)]
pub struct Tree {
    /// This tree's number in [`Loc::tree`].
    id: u32,
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
    /// Levels below the root (0: the root is a leaf).
    height: u32,
    len: usize,
    /// Scratch: entries of a node being split, points being reinserted, nodes to visit.
    split_buf: Vec<Entry>,
    orphans: Vec<Entry>,
}

impl Tree {
    pub fn new(id: u32) -> Tree {
        Tree {
            id,
            nodes: vec![Node::new(true)],
            free: Vec::new(),
            root: 0,
            height: 0,
            len: 0,
            split_buf: Vec::with_capacity(MAX_FILL + 1),
            orphans: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Levels below the root.
    #[cfg(test)]
    pub fn height(&self) -> u32 {
        self.height
    }

    fn alloc(&mut self, leaf: bool) -> u32 {
        match self.free.pop() {
            Some(id) => {
                let node = &mut self.nodes[id as usize];
                node.len = 0;
                node.leaf = leaf;
                node.parent = NONE;
                node.pos = NONE;
                id
            }
            None => {
                self.nodes.push(Node::new(leaf));
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Records where entry `pos` of `node` points: the slot's place or the child's parent.
    #[inline]
    fn attach(&mut self, node: u32, pos: usize, locs: &mut Locs) {
        let n = &self.nodes[node as usize];
        let child = n.child[pos];
        if n.leaf {
            locs[child as usize] = Loc {
                tree: self.id,
                node,
                pos: pos as u32,
            };
        } else {
            let c = &mut self.nodes[child as usize];
            c.parent = node;
            c.pos = pos as u32;
        }
    }

    /// Brings the entries on the path above `node` up to date with their children, stopping at
    /// the first that already is.
    fn refresh_up(&mut self, mut node: u32) {
        loop {
            let n = &self.nodes[node as usize];
            let (parent, pos) = (n.parent, n.pos as usize);
            if parent == NONE {
                return;
            }
            let (rect, reach) = n.cover();
            let p = &mut self.nodes[parent as usize];
            let old = p.get(pos);
            if old.rect == rect && old.reach == reach {
                return;
            }
            p.set(
                pos,
                &Entry {
                    rect,
                    reach,
                    child: node,
                },
            );
            node = parent;
        }
    }

    /// Widens the entries on the path above `node` to hold `e`'s boxes (just added below them),
    /// stopping at the first that already does.
    fn grow_up(&mut self, mut node: u32, e: &Entry) {
        loop {
            let n = &self.nodes[node as usize];
            let (parent, pos) = (n.parent, n.pos as usize);
            if parent == NONE {
                return;
            }
            let p = &mut self.nodes[parent as usize];
            let old = p.get(pos);
            let grown = Entry {
                rect: union(&old.rect, &e.rect),
                reach: union(&old.reach, &e.reach),
                child: node,
            };
            if grown == old {
                return;
            }
            p.set(pos, &grown);
            node = parent;
        }
    }

    /// Adds the point entry of `slot` (its rect is the point).
    pub fn insert(&mut self, e: Entry, locs: &mut Locs) {
        let leaf = self.choose(&e.rect, &e.reach, 0);
        self.add(leaf, e, locs);
        self.len += 1;
    }

    /// The node at `level` (0 = leaves) whose point box and reach union grow least (in area) to
    /// take `rect` and `reach`.
    fn choose(&self, rect: &Rect, reach: &Rect, level: u32) -> u32 {
        let mut node = self.root;
        let mut at = self.height;
        while at > level {
            let n = &self.nodes[node as usize];
            let mut best = 0;
            let mut best_key = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
            for i in 0..n.len() {
                let r = [n.x0[i], n.y0[i], n.x1[i], n.y1[i]];
                let rr = [n.rx0[i], n.ry0[i], n.rx1[i], n.ry1[i]];
                let u = union(&r, rect);
                let ur = union(&rr, reach);
                let a = area(&r) + area(&rr);
                let key = (area(&u) + area(&ur) - a, margin(&u) - margin(&r), a);
                if key < best_key {
                    best_key = key;
                    best = i;
                }
            }
            node = n.child[best];
            at -= 1;
        }
        node
    }

    /// Puts `e` into `node`, splitting up the path as needed.
    fn add(&mut self, mut node: u32, mut e: Entry, locs: &mut Locs) {
        // The entry added at the bottom: the boxes above the last split grow by it alone.
        let added = e;
        loop {
            let n = &mut self.nodes[node as usize];
            if n.len() < MAX_FILL {
                let pos = n.len();
                n.set(pos, &e);
                n.len += 1;
                self.attach(node, pos, locs);
                self.grow_up(node, &added);
                return;
            }
            let sibling = self.split(node, e, locs);
            let (rect, reach) = self.nodes[node as usize].cover();
            let (srect, sreach) = self.nodes[sibling as usize].cover();
            let parent = self.nodes[node as usize].parent;
            if parent == NONE {
                let root = self.alloc(false);
                let r = &mut self.nodes[root as usize];
                r.set(
                    0,
                    &Entry {
                        rect,
                        reach,
                        child: node,
                    },
                );
                r.set(
                    1,
                    &Entry {
                        rect: srect,
                        reach: sreach,
                        child: sibling,
                    },
                );
                r.len = 2;
                self.attach(root, 0, locs);
                self.attach(root, 1, locs);
                self.root = root;
                self.height += 1;
                return;
            }
            let pos = self.nodes[node as usize].pos as usize;
            self.nodes[parent as usize].set(
                pos,
                &Entry {
                    rect,
                    reach,
                    child: node,
                },
            );
            e = Entry {
                rect: srect,
                reach: sreach,
                child: sibling,
            };
            node = parent;
        }
    }

    /// Splits the full `node` plus `extra` in two (R*: the axis of least total margin, then the
    /// distribution of least overlap, then of least area); `node` keeps the first half, the
    /// returned new node (same level, not yet in a parent) the second.
    fn split(&mut self, node: u32, extra: Entry, locs: &mut Locs) -> u32 {
        let mut buf = std::mem::take(&mut self.split_buf);
        buf.clear();
        let n = &self.nodes[node as usize];
        buf.extend((0..n.len()).map(|i| n.get(i)));
        buf.push(extra);
        let total = buf.len();
        let leaf = n.leaf;

        let mut prefix = [EMPTY; MAX_FILL + 1];
        let mut suffix = [EMPTY; MAX_FILL + 1];
        let sort = |buf: &mut Vec<Entry>, axis: usize| {
            buf.sort_by(|a, b| {
                (a.rect[axis] + a.rect[axis + 2]).total_cmp(&(b.rect[axis] + b.rect[axis + 2]))
            })
        };
        let boxes = |buf: &[Entry], prefix: &mut [Rect], suffix: &mut [Rect]| {
            let mut acc = EMPTY;
            for (i, e) in buf.iter().enumerate() {
                acc = union(&acc, &e.rect);
                prefix[i] = acc;
            }
            acc = EMPTY;
            for (i, e) in buf.iter().enumerate().rev() {
                acc = union(&acc, &e.rect);
                suffix[i] = acc;
            }
        };
        // The axis of least total margin over the allowed distributions.
        let mut best_axis = 0;
        let mut best_margin = f64::INFINITY;
        for axis in 0..2 {
            sort(&mut buf, axis);
            boxes(&buf, &mut prefix, &mut suffix);
            let sum: f64 = (SPLIT_MIN..=total - SPLIT_MIN)
                .map(|k| margin(&prefix[k - 1]) + margin(&suffix[k]))
                .sum();
            if sum < best_margin {
                best_margin = sum;
                best_axis = axis;
            }
        }
        sort(&mut buf, best_axis);
        boxes(&buf, &mut prefix, &mut suffix);
        let mut best_k = SPLIT_MIN;
        let mut best_key = (f64::INFINITY, f64::INFINITY);
        for k in SPLIT_MIN..=total - SPLIT_MIN {
            let key = (
                overlap(&prefix[k - 1], &suffix[k]),
                area(&prefix[k - 1]) + area(&suffix[k]),
            );
            if key < best_key {
                best_key = key;
                best_k = k;
            }
        }

        let sibling = self.alloc(leaf);
        let n = &mut self.nodes[node as usize];
        for (i, e) in buf[..best_k].iter().enumerate() {
            n.set(i, e);
        }
        n.len = best_k as u32;
        let s = &mut self.nodes[sibling as usize];
        for (i, e) in buf[best_k..].iter().enumerate() {
            s.set(i, e);
        }
        s.len = (total - best_k) as u32;
        for i in 0..best_k {
            self.attach(node, i, locs);
        }
        for i in 0..total - best_k {
            self.attach(sibling, i, locs);
        }
        self.split_buf = buf;
        sibling
    }

    /// The point entry at `loc` (which must be in this tree).
    pub fn entry(&self, loc: Loc) -> Entry {
        self.nodes[loc.node as usize].get(loc.pos as usize)
    }

    /// Removes the point entry at `loc` (which must be in this tree); returns it.
    pub fn remove(&mut self, loc: Loc, locs: &mut Locs) -> Entry {
        let leaf = loc.node;
        let removed = self.take(leaf, loc.pos as usize, locs);
        locs[removed.child as usize] = Loc::NOWHERE;
        self.len -= 1;

        let mut orphans = std::mem::take(&mut self.orphans);
        orphans.clear();
        let mut node = leaf;
        loop {
            if node == self.root {
                break;
            }
            let n = &self.nodes[node as usize];
            if n.len() >= MIN_FILL {
                self.refresh_up(node);
                break;
            }
            let (parent, pos) = (n.parent, n.pos as usize);
            self.take(parent, pos, locs);
            self.dissolve(node, &mut orphans);
            node = parent;
        }
        // The root keeps at least two children unless it is a leaf.
        loop {
            let r = &self.nodes[self.root as usize];
            if r.leaf {
                break;
            }
            match r.len() {
                0 => {
                    self.nodes[self.root as usize].leaf = true;
                    self.height = 0;
                    break;
                }
                1 => {
                    let old = self.root;
                    self.root = r.child[0];
                    let nr = &mut self.nodes[self.root as usize];
                    nr.parent = NONE;
                    nr.pos = NONE;
                    self.free.push(old);
                    self.height -= 1;
                }
                _ => break,
            }
        }
        for e in &orphans {
            let leaf = self.choose(&e.rect, &e.reach, 0);
            self.add(leaf, *e, locs);
        }
        self.orphans = orphans;
        removed
    }

    /// Swap-removes entry `pos` of `node` (the last entry moves into its place) and returns it.
    fn take(&mut self, node: u32, pos: usize, locs: &mut Locs) -> Entry {
        let n = &mut self.nodes[node as usize];
        let e = n.get(pos);
        let last = n.len() - 1;
        if pos != last {
            let moved = n.get(last);
            n.set(pos, &moved);
        }
        n.len -= 1;
        if pos != last {
            self.attach(node, pos, locs);
        }
        e
    }

    /// Frees `node` and every node below it, collecting their points.
    fn dissolve(&mut self, node: u32, orphans: &mut Vec<Entry>) {
        let mut stack = vec![node];
        while let Some(id) = stack.pop() {
            let n = &self.nodes[id as usize];
            for i in 0..n.len() {
                if n.leaf {
                    orphans.push(n.get(i));
                } else {
                    stack.push(n.child[i]);
                }
            }
            self.free.push(id);
        }
    }

    /// Appends the slot of every point inside the closed box `b` (whose reach box holds `q`, when
    /// given).
    #[inline]
    pub fn query(&self, b: &Rect, q: Option<[f64; 2]>, out: &mut Vec<u32>) {
        if self.len == 0 {
            return;
        }
        match q {
            Some(q) => self.walk::<true>(self.root, b, q, out),
            None => self.walk::<false>(self.root, b, [0.0; 2], out),
        }
    }

    fn walk<const REACH: bool>(&self, id: u32, b: &Rect, q: [f64; 2], out: &mut Vec<u32>) {
        let n = &self.nodes[id as usize];
        // Every entry slot is tested without branching (whole arrays, which the compiler
        // vectorizes), giving a bit mask of the hits; slots past `len` are masked off. A leaf
        // entry's box is its point (x0 = x1, y0 = y1), so a leaf reads only x0 and y0.
        let (x1, y1) = if n.leaf {
            (&n.x0, &n.y0)
        } else {
            (&n.x1, &n.y1)
        };
        let mut hits: u32 = 0;
        for i in 0..MAX_FILL {
            let mut hit = (n.x0[i] <= b[2]) & (x1[i] >= b[0]) & (n.y0[i] <= b[3]) & (y1[i] >= b[1]);
            if REACH {
                hit &= (n.rx0[i] <= q[0])
                    & (n.rx1[i] >= q[0])
                    & (n.ry0[i] <= q[1])
                    & (n.ry1[i] >= q[1]);
            }
            hits |= u32::from(hit) << i;
        }
        hits &= LIVE[n.len()];
        while hits != 0 {
            let i = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            if n.leaf {
                out.push(n.child[i]);
            } else {
                self.walk::<REACH>(n.child[i], b, q, out);
            }
        }
    }

    /// Checks the invariants of the module doc against `locs`; panics naming the first broken one.
    #[cfg(test)]
    pub fn check(&self, locs: &Locs) {
        let mut seen = 0usize;
        let mut leaf_depth = None;
        let mut stack = vec![(self.root, 0u32)];
        let mut live = vec![false; self.nodes.len()];
        let root = &self.nodes[self.root as usize];
        assert_eq!(root.parent, NONE, "the root has no parent");
        assert!(
            root.leaf || root.len() >= 2,
            "an inner root has two children"
        );
        assert_eq!(root.leaf, self.height == 0, "the height matches the root");
        while let Some((id, depth)) = stack.pop() {
            assert!(!live[id as usize], "node {id} is reached twice");
            live[id as usize] = true;
            let n = &self.nodes[id as usize];
            assert!(n.len() <= MAX_FILL);
            if id != self.root {
                assert!(n.len() >= MIN_FILL, "node {id} holds {} entries", n.len());
            }
            for i in 0..n.len() {
                let e = n.get(i);
                if n.leaf {
                    assert_eq!(e.rect[0], e.rect[2], "a leaf entry is a point");
                    assert_eq!(e.rect[1], e.rect[3], "a leaf entry is a point");
                    let want = Loc {
                        tree: self.id,
                        node: id,
                        pos: i as u32,
                    };
                    assert_eq!(
                        locs[e.child as usize], want,
                        "the slot map finds slot {}",
                        e.child
                    );
                    seen += 1;
                } else {
                    let c = &self.nodes[e.child as usize];
                    assert_eq!(
                        (c.parent, c.pos),
                        (id, i as u32),
                        "child {} knows its entry",
                        e.child
                    );
                    assert_eq!(
                        c.cover(),
                        (e.rect, e.reach),
                        "entry {i} of {id} covers its child exactly"
                    );
                    stack.push((e.child, depth + 1));
                }
            }
            if n.leaf {
                let d = *leaf_depth.get_or_insert(depth);
                assert_eq!(d, depth, "every leaf at the same depth");
                assert_eq!(d, self.height, "leaves at the tree's height");
            }
        }
        assert_eq!(seen, self.len, "the tree holds len points");
        let free: std::collections::HashSet<u32> = self.free.iter().copied().collect();
        assert_eq!(free.len(), self.free.len(), "a node is freed once");
        for (id, &l) in live.iter().enumerate() {
            assert_ne!(
                l,
                free.contains(&(id as u32)),
                "node {id} is either live or free"
            );
        }
        let in_tree = locs.iter().filter(|l| l.tree == self.id).count();
        assert_eq!(
            in_tree, self.len,
            "the slot map names no other point in this tree"
        );
    }
}
