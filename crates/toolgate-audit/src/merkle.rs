//! The RFC 9162 (Certificate Transparency v2) Merkle tree over the audit lines: leaf and
//! node hashes, roots, inclusion and consistency proofs, and their verification.
//!
//! The proof builders follow RFC 9162 section 2.1.3.1 (PATH) and 2.1.4.1 (SUBPROOF)
//! literally; the verifiers follow sections 2.1.3.2 and 2.1.4.2 step by step. The unit
//! tests check both against a naive implementation of the definitions for every tree
//! size from 1 to 40.

use sha2::{Digest, Sha256};

/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// The hash of a leaf: SHA-256(0x00 || line).
pub fn leaf_hash(line: &[u8]) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([0x00]);
    hasher.update(line);
    hasher.finalize().into()
}

/// The hash of an interior node: SHA-256(0x01 || left || right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([0x01]);
    hasher.update(left);
    hasher.update(right);
    hasher.finalize().into()
}

/// The root of the empty tree: SHA-256 of the empty string.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The largest power of two strictly smaller than `n` (`n` >= 2).
fn split_point(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// The right edge of a growing tree: the roots of its complete subtrees, largest first.
/// Appending is amortized O(1); the root is O(log n). This is all the writer keeps in
/// memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    /// (height, hash) of each complete subtree, left to right, heights strictly falling.
    // INVARIANT: the heights are the set bits of `size`, from the highest down.
    nodes: Vec<(u32, Hash)>,
}

impl Frontier {
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of leaves appended.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn push(&mut self, leaf: Hash) {
        let mut node = (0u32, leaf);
        while let Some(&(height, left)) = self.nodes.last() {
            if height != node.0 {
                break;
            }
            self.nodes.pop();
            node = (height + 1, node_hash(&left, &node.1));
        }
        self.nodes.push(node);
        self.size += 1;
    }

    /// The hashes of the complete subtrees of the right edge, largest first (one per set
    /// bit of the size): with the size, all a tree needs to keep growing (RFC 9162's
    /// compact range of the whole tree).
    pub fn nodes(&self) -> Vec<Hash> {
        self.nodes.iter().map(|(_, hash)| *hash).collect()
    }

    /// The frontier of a tree of `size` leaves whose right edge is `nodes` (as
    /// [`Frontier::nodes`] gives it); None when the count does not fit the size.
    pub fn from_parts(size: u64, nodes: &[Hash]) -> Option<Frontier> {
        if nodes.len() != size.count_ones() as usize {
            return None;
        }
        let heights = (0..64u32).rev().filter(|h| size & (1u64 << h) != 0);
        Some(Frontier {
            size,
            nodes: heights.zip(nodes.iter().copied()).collect(),
        })
    }

    /// The Merkle tree hash (MTH) of the leaves appended so far.
    pub fn root(&self) -> Hash {
        let mut iter = self.nodes.iter().rev();
        let Some(&(_, mut root)) = iter.next() else {
            return empty_root();
        };
        for (_, left) in iter {
            root = node_hash(left, &root);
        }
        root
    }
}

/// A whole tree held in memory (about 64 bytes per leaf), for building proofs.
#[derive(Debug, Clone)]
pub struct Tree {
    /// `levels[h][i]` is the hash of the complete subtree of 2^h leaves starting at
    /// leaf i * 2^h; `levels[0]` are the leaves.
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    pub fn new(leaves: Vec<Hash>) -> Self {
        let mut levels = vec![leaves];
        while let Some(last) = levels.last() {
            if last.len() < 2 {
                break;
            }
            let next: Vec<Hash> = last
                .chunks_exact(2)
                .map(|pair| node_hash(&pair[0], &pair[1]))
                .collect();
            levels.push(next);
        }
        Tree { levels }
    }

    pub fn size(&self) -> u64 {
        self.levels[0].len() as u64
    }

    pub fn leaf(&self, index: u64) -> Option<Hash> {
        self.levels[0].get(index as usize).copied()
    }

    /// MTH(D[start:end]). A complete, aligned subtree is looked up; any other range is
    /// split as MTH splits it. The ranges the proofs ask for are complete subtrees or run
    /// to the right edge, so this costs O(log n).
    fn subtree(&self, start: u64, end: u64) -> Hash {
        let n = end - start;
        if n == 0 {
            return empty_root();
        }
        if n.is_power_of_two() && start.is_multiple_of(n) {
            let height = n.trailing_zeros() as usize;
            return self.levels[height][(start >> height) as usize];
        }
        let k = split_point(n);
        node_hash(
            &self.subtree(start, start + k),
            &self.subtree(start + k, end),
        )
    }

    /// The root of the first `size` leaves.
    pub fn root(&self, size: u64) -> Hash {
        self.subtree(0, size.min(self.size()))
    }

    /// The inclusion proof of leaf `index` in the tree of the first `size` leaves
    /// (RFC 9162 section 2.1.3.1); `None` if `index >= size` or `size` exceeds the tree.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Option<Vec<Hash>> {
        if index >= size || size > self.size() {
            return None;
        }
        let mut proof = Vec::new();
        self.path(index, 0, size, &mut proof);
        Some(proof)
    }

    /// PATH(m, D[start:end]), appended to `out` from the leaf upwards.
    fn path(&self, m: u64, start: u64, end: u64, out: &mut Vec<Hash>) {
        let n = end - start;
        if n <= 1 {
            return;
        }
        let k = split_point(n);
        if m < k {
            self.path(m, start, start + k, out);
            out.push(self.subtree(start + k, end));
        } else {
            self.path(m - k, start + k, end, out);
            out.push(self.subtree(start, start + k));
        }
    }

    /// The consistency proof between the trees of `first` and `second` leaves (RFC 9162
    /// section 2.1.4.1); empty when `first` is 0 or equals `second`; `None` if
    /// `first > second` or `second` exceeds the tree.
    pub fn consistency_proof(&self, first: u64, second: u64) -> Option<Vec<Hash>> {
        if first > second || second > self.size() {
            return None;
        }
        let mut proof = Vec::new();
        if first > 0 && first < second {
            self.subproof(first, 0, second, true, &mut proof);
        }
        Some(proof)
    }

    /// SUBPROOF(m, D[start:end], b).
    fn subproof(&self, m: u64, start: u64, end: u64, b: bool, out: &mut Vec<Hash>) {
        let n = end - start;
        if m == n {
            if !b {
                out.push(self.subtree(start, end));
            }
            return;
        }
        let k = split_point(n);
        if m <= k {
            self.subproof(m, start, start + k, b, out);
            out.push(self.subtree(start + k, end));
        } else {
            self.subproof(m - k, start + k, end, false, out);
            out.push(self.subtree(start, start + k));
        }
    }
}

/// The consistency proof from the tree whose right edge is `old` to that tree with
/// `appended` leaves added (RFC 9162 section 2.1.4.1), without the old leaves: every
/// node of such a proof lies either wholly in the old tree, where it is one of the
/// old tree's complete subtrees (`old`'s nodes), or wholly among the appended leaves.
/// Empty when `old` is empty or nothing is appended.
pub fn consistency_proof_extending(old: &Frontier, appended: &[Hash]) -> Vec<Hash> {
    let first = old.size();
    let second = first + appended.len() as u64;
    let mut proof = Vec::new();
    if first == 0 || appended.is_empty() {
        return proof;
    }
    let subtree = |start: u64, end: u64| -> Hash {
        if start >= first {
            return slice_root(&appended[(start - first) as usize..(end - first) as usize]);
        }
        // INVARIANT (see above): a node below `first` is one of the old tree's
        // complete subtrees, found by its start and size.
        let mut at = 0u64;
        for (height, hash) in &old.nodes {
            let len = 1u64 << height;
            if at == start && at + len == end {
                return *hash;
            }
            at += len;
        }
        empty_root()
    };
    extending_subproof(first, 0, second, true, &subtree, &mut proof);
    proof
}

/// SUBPROOF(m, D[start:end], b) over a function giving MTH of a range.
fn extending_subproof(
    m: u64,
    start: u64,
    end: u64,
    b: bool,
    subtree: &dyn Fn(u64, u64) -> Hash,
    out: &mut Vec<Hash>,
) {
    let n = end - start;
    if m == n {
        if !b {
            out.push(subtree(start, end));
        }
        return;
    }
    let k = split_point(n);
    if m <= k {
        extending_subproof(m, start, start + k, b, subtree, out);
        out.push(subtree(start + k, end));
    } else {
        extending_subproof(m - k, start + k, end, false, subtree, out);
        out.push(subtree(start, start + k));
    }
}

/// MTH of a slice of leaf hashes.
fn slice_root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split_point(n as u64) as usize;
            node_hash(&slice_root(&leaves[..k]), &slice_root(&leaves[k..]))
        }
    }
}

/// Verifies an inclusion proof (RFC 9162 section 2.1.3.2).
pub fn verify_inclusion(
    leaf_index: u64,
    tree_size: u64,
    leaf: &Hash,
    proof: &[Hash],
    root: &Hash,
) -> bool {
    if leaf_index >= tree_size {
        return false;
    }
    let (mut fn_, mut sn) = (leaf_index, tree_size - 1);
    let mut r = *leaf;
    for p in proof {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    sn == 0 && r == *root
}

/// Verifies a consistency proof (RFC 9162 section 2.1.4.2). A tree is trivially
/// consistent with itself (empty proof, equal roots) and with the empty tree.
pub fn verify_consistency(
    first: u64,
    second: u64,
    proof: &[Hash],
    first_root: &Hash,
    second_root: &Hash,
) -> bool {
    if first > second {
        return false;
    }
    if first == second {
        return proof.is_empty() && first_root == second_root;
    }
    if first == 0 {
        return proof.is_empty() && *first_root == empty_root();
    }
    // 1. an empty proof fails.
    if proof.is_empty() {
        return false;
    }
    // 2. if first is an exact power of 2, prepend first_hash.
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if first.is_power_of_two() {
        path.push(*first_root);
    }
    path.extend_from_slice(proof);
    // 3. fn = first - 1, sn = second - 1.
    let (mut fn_, mut sn) = (first - 1, second - 1);
    // 4. shift while LSB(fn) is set.
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    // 5. fr = sr = the first value.
    let (mut fr, mut sr) = (path[0], path[0]);
    // 6. for each subsequent value c.
    for c in &path[1..] {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    // 7. compare.
    fr == *first_root && sr == *second_root && sn == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    // The definitions of RFC 9162 section 2.1.1, 2.1.3.1 and 2.1.4.1, written as
    // directly as possible over slices, with no shortcut.
    fn mth(d: &[Hash]) -> Hash {
        match d.len() {
            0 => empty_root(),
            1 => d[0],
            n => {
                let k = split_point(n as u64) as usize;
                node_hash(&mth(&d[..k]), &mth(&d[k..]))
            }
        }
    }

    fn naive_path(m: usize, d: &[Hash]) -> Vec<Hash> {
        let n = d.len();
        if n == 1 {
            return vec![];
        }
        let k = split_point(n as u64) as usize;
        let mut p;
        if m < k {
            p = naive_path(m, &d[..k]);
            p.push(mth(&d[k..]));
        } else {
            p = naive_path(m - k, &d[k..]);
            p.push(mth(&d[..k]));
        }
        p
    }

    fn naive_subproof(m: usize, d: &[Hash], b: bool) -> Vec<Hash> {
        let n = d.len();
        if m == n {
            return if b { vec![] } else { vec![mth(d)] };
        }
        let k = split_point(n as u64) as usize;
        let mut p;
        if m <= k {
            p = naive_subproof(m, &d[..k], b);
            p.push(mth(&d[k..]));
        } else {
            p = naive_subproof(m - k, &d[k..], false);
            p.push(mth(&d[..k]));
        }
        p
    }

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n)
            .map(|i| leaf_hash(format!("leaf {i}").as_bytes()))
            .collect()
    }

    #[test]
    fn a_frontier_rebuilt_from_its_parts_continues_the_same_tree() {
        let d = leaves(40);
        for cut in 0..40usize {
            let mut whole = Frontier::new();
            for leaf in &d[..cut] {
                whole.push(*leaf);
            }
            let mut resumed = Frontier::from_parts(cut as u64, &whole.nodes()).unwrap();
            assert_eq!(resumed.root(), whole.root());
            for leaf in &d[cut..] {
                resumed.push(*leaf);
                whole.push(*leaf);
                assert_eq!(resumed.root(), whole.root(), "resumed at {cut}");
            }
            assert!(Frontier::from_parts(cut as u64 + 1, &[]).is_none());
        }
    }

    #[test]
    fn roots_match_the_definition_for_sizes_0_to_40() {
        let d = leaves(40);
        let tree = Tree::new(d.clone());
        let mut frontier = Frontier::new();
        assert_eq!(frontier.root(), mth(&[]));
        for n in 1..=40 {
            frontier.push(d[n - 1]);
            assert_eq!(frontier.size(), n as u64);
            assert_eq!(frontier.root(), mth(&d[..n]), "frontier root at {n}");
            assert_eq!(tree.root(n as u64), mth(&d[..n]), "tree root at {n}");
        }
    }

    #[test]
    fn inclusion_proofs_match_the_definition_and_verify() {
        let d = leaves(41);
        let tree = Tree::new(d[..40].to_vec());
        for n in 1..=40usize {
            let root = mth(&d[..n]);
            for m in 0..n {
                let proof = tree.inclusion_proof(m as u64, n as u64).unwrap();
                assert_eq!(proof, naive_path(m, &d[..n]), "PATH({m}, D[{n}])");
                assert!(verify_inclusion(m as u64, n as u64, &d[m], &proof, &root));
                // Every wrong input fails.
                assert!(!verify_inclusion(
                    m as u64,
                    n as u64,
                    &leaf_hash(b"other"),
                    &proof,
                    &root
                ));
                assert!(!verify_inclusion(
                    m as u64,
                    n as u64 + 1,
                    &d[m],
                    &proof,
                    &mth(&d[..n + 1])
                ));
                if n > 1 {
                    let other = if m == 0 { 1 } else { m - 1 };
                    assert!(!verify_inclusion(
                        other as u64,
                        n as u64,
                        &d[m],
                        &proof,
                        &root
                    ));
                    let mut bad = proof.clone();
                    bad[0][0] ^= 1;
                    assert!(!verify_inclusion(m as u64, n as u64, &d[m], &bad, &root));
                    assert!(!verify_inclusion(
                        m as u64,
                        n as u64,
                        &d[m],
                        &proof[1..],
                        &root
                    ));
                }
            }
            assert!(tree.inclusion_proof(n as u64, n as u64).is_none());
        }
    }

    #[test]
    fn proofs_from_a_frontier_and_the_appended_leaves_match_the_whole_tree() {
        let d = leaves(40);
        let tree = Tree::new(d.clone());
        for m in 0..=40usize {
            let mut old = Frontier::new();
            for leaf in &d[..m] {
                old.push(*leaf);
            }
            for n in m..=40usize {
                let proof = consistency_proof_extending(&old, &d[m..n]);
                assert_eq!(
                    proof,
                    tree.consistency_proof(m as u64, n as u64).unwrap(),
                    "{m} -> {n}"
                );
            }
        }
    }

    #[test]
    fn consistency_proofs_match_the_definition_and_verify() {
        let d = leaves(41);
        let tree = Tree::new(d[..40].to_vec());
        for n in 1..=40usize {
            let second = mth(&d[..n]);
            for m in 1..=n {
                let first = mth(&d[..m]);
                let proof = tree.consistency_proof(m as u64, n as u64).unwrap();
                let expected = if m == n {
                    vec![]
                } else {
                    naive_subproof(m, &d[..n], true)
                };
                assert_eq!(proof, expected, "PROOF({m}, D[{n}])");
                assert!(
                    verify_consistency(m as u64, n as u64, &proof, &first, &second),
                    "{m} -> {n}"
                );
                // A forked first tree fails.
                let mut forked = d[..m].to_vec();
                forked[m - 1] = leaf_hash(b"fork");
                assert!(!verify_consistency(
                    m as u64,
                    n as u64,
                    &proof,
                    &mth(&forked),
                    &second
                ));
                if m < n {
                    let mut bad = proof.clone();
                    let last = bad.len() - 1;
                    bad[last][5] ^= 1;
                    assert!(!verify_consistency(
                        m as u64, n as u64, &bad, &first, &second
                    ));
                    assert!(!verify_consistency(
                        m as u64,
                        n as u64,
                        &[],
                        &first,
                        &second
                    ));
                    assert!(!verify_consistency(
                        m as u64,
                        n as u64 + 1,
                        &proof,
                        &first,
                        &mth(&d[..n + 1])
                    ));
                }
            }
        }
    }
}
