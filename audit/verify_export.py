#!/usr/bin/env python3
"""Verify a toolgate audit export with nothing but the Python 3 standard library.

    python3 verify_export.py EXPORT_DIR_OR_BUNDLE --key-fingerprint HEX
        [--trusted-checkpoint FILE] [--expect-full | --expect-run RUN_ID]
        [--witness-key VKEY ... [--quorum N]]
    python3 verify_export.py FLEET_EXPORT_DIR --fleet --fleet-key-fingerprint HEX
        --key-fingerprint ORIGIN=HEX ... [--expect-run RUN_ID]
        [--trusted-checkpoint FILE] [--witness-key VKEY ... [--quorum N]]

EXPORT_DIR_OR_BUNDLE is an export directory, or a single-file bundle of one (the JSON
object the console downloads from GET /v1/runs/{id}/export: {"format":
"toolgate-audit-export-bundle/1", "files": {name: text}}); a bundle is unpacked into a
temporary directory (only the known file names, nothing else) and checked the same way.

Get HEX through a channel you trust (the operator runs `toolgate audit key`), never
from the export itself: a forger could ship their own key. Without it the export's own
key is trusted, and its fingerprint is printed with a warning.

Checks, in order: the public key against the fingerprint; the signature of
manifest.json (manifest.sig: Ed25519 over "toolgate-audit-export-manifest/1\n" and the
manifest's bytes), so an unsigned or altered manifest is refused; what the auditor
expects (--expect-full, --expect-run) against that signed statement; the file hashes in
manifest.json; every checkpoint signature (C2SP signed note, Ed25519 after RFC 8032);
the consistency proofs between consecutive checkpoints (RFC 9162 2.1.4.2); that every
line re-canonicalizes to the same bytes (RFC 8785); then, for a full export, the
seq/prev chain and the Merkle root at every checkpoint, or, for a filtered export, each
event's inclusion proof (RFC 9162 2.1.3.2) against the newest checkpoint, that every
event matches the signed filter, and that every tool_requested has its closing event in
the export (or is listed as still open in the signed manifest). Since the manifest
signs the sha256 of events.jsonl, a dropped, added or changed line is detected. With
--trusted-checkpoint, the export must extend the checkpoint you kept (a fork or a cut
exits 2); a trusted checkpoint file that cannot be read is an error.

A fleet export (`toolgate audit export --cluster-db URL --run RUN_ID`, manifest format
toolgate-fleet-export/1) is verified only with --fleet (and any other export only
without it), so an export cannot choose which checks apply. It is checked the same way
per sidecar: each sidecar's checkpoint signature (its key, pinned with
--key-fingerprint HEX for any one sidecar or ORIGIN=HEX for that sidecar only;
repeatable; a sidecar key equal to the fleet key, or shared by two origins, is
refused), each event line's canonical bytes, run and inclusion proof against that
checkpoint, and each checkpoint's inclusion proof in the fleet tree whose signed fleet
checkpoint (toolgate/fleet) is fleet-checkpoint.txt (signed with the fleet key, pinned
with --fleet-key-fingerprint). Its manifest is signed with the fleet key too
(manifest.sig), holds the sha256 of every file it vouches for, and lists every seq and
leaf hash of the run per sidecar: the sidecars' events.jsonl (each ending with a
newline) must hold exactly those (--expect-run RUN_ID checks the run). The first bad
sidecar and seq are named. --trusted-checkpoint is a fleet checkpoint the exported one
must extend (the same, or a consistency proof in the manifest) or a sidecar's
checkpoint at the size of its exported one; anything the export cannot show exits 2.
With --witness-key, fleet-cosignatures.txt must hold fleet checkpoints cosigned by
--quorum of the keys, and the exported fleet checkpoint must extend the largest such one
(its consistency proof in the manifest; a fork exits 2).

With --witness-key (a witness's cosignature key, `name+keyid+base64`, type 0x04;
repeatable), cosignatures.txt must hold checkpoints of checkpoints.txt cosigned
(c2sp.org/tlog-cosignature, cosignature/v1) by --quorum of those keys (default: all);
a cosignature that does not verify, or no checkpoint with a quorum, exits 3.

Exit codes: 0 intact, 1 integrity failure, 2 truncation or fork, 3 key or signature
problem. The first bad seq is named.
"""

import argparse
import base64
import hashlib
import json
import os
import sys
import tempfile

INTACT, INTEGRITY, TRUNCATION, SIGNATURE = 0, 1, 2, 3
GENESIS_PREV = "0" * 64
MANIFEST_DOMAIN = b"toolgate-audit-export-manifest/1\n"
FLEET_MANIFEST_DOMAIN = b"toolgate-fleet-export-manifest/1\n"
CLOSING_TYPES = ("tool_executed", "tool_denied", "tool_failed", "tool_timeout", "tool_allowed")
MAX_SAFE_INTEGER = 2**53 - 1


class Failure(Exception):
    def __init__(self, code, seq, message):
        super().__init__(message)
        self.code, self.seq, self.message = code, seq, message


# ---- Ed25519 signature verification, RFC 8032 section 5.1.7 (after its section 6 code).

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def point_add(a, b):  # extended homogeneous coordinates (X, Y, Z, T)
    A = (a[1] - a[0]) * (b[1] - b[0]) % P
    B = (a[1] + a[0]) * (b[1] + b[0]) % P
    C = 2 * a[3] * b[3] * D % P
    DD = 2 * a[2] * b[2] % P
    E, F, G, H = B - A, DD - C, DD + C, B + A
    return (E * F % P, G * H % P, F * G % P, E * H % P)


def point_mul(s, p):
    q = (0, 1, 1, 0)  # the neutral element
    while s > 0:
        if s & 1:
            q = point_add(q, p)
        p = point_add(p, p)
        s >>= 1
    return q


def point_equal(a, b):
    return (a[0] * b[2] - b[0] * a[2]) % P == 0 and (a[1] * b[2] - b[1] * a[2]) % P == 0


def recover_x(y, sign):
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P != 0:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P != 0:
        return None
    if (x & 1) != sign:
        x = P - x
    return x


def point_decompress(s):
    if len(s) != 32:
        return None
    y = int.from_bytes(s, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


G_Y = 4 * pow(5, P - 2, P) % P
G_X = recover_x(G_Y, 0)
BASE = (G_X, G_Y, 1, G_X * G_Y % P)


def ed25519_verify(public, message, signature):
    if len(public) != 32 or len(signature) != 64:
        return False
    a = point_decompress(public)
    r = point_decompress(signature[:32])
    if a is None or r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= L:
        return False
    h = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % L
    return point_equal(point_mul(s, BASE), point_add(r, point_mul(h, a)))


# ---- RFC 8785 canonical JSON.
#
# json.dumps(..., ensure_ascii=False) writes a string or an integer exactly as RFC 8785
# does; it is only safe here because every number in a line is an integer within
# +-(2^53 - 1) (floats are written differently by Python and ECMAScript), which
# jcs_safe() checks for each line. Object keys are sorted by their UTF-16 code units as
# RFC 8785 requires, not with sort_keys=True: that sorts by code point, which differs for
# keys with characters above U+FFFF.


def jcs_safe(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INTEGER
    if isinstance(value, list):
        return all(jcs_safe(v) for v in value)
    if isinstance(value, dict):
        return all(jcs_safe(v) for v in value.values())
    return False  # a float


def canonical(value):
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: item[0].encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


# ---- RFC 9162 Merkle tree.


def sha256(data):
    return hashlib.sha256(data).digest()


def leaf_hash(line):
    return sha256(b"\x00" + line)


def node_hash(left, right):
    return sha256(b"\x01" + left + right)


class Frontier:
    """The roots of the complete subtrees on the right edge of a growing tree."""

    def __init__(self):
        self.size, self.nodes = 0, []  # [(height, hash)], heights falling

    def push(self, leaf):
        node = (0, leaf)
        while self.nodes and self.nodes[-1][0] == node[0]:
            height, left = self.nodes.pop()
            node = (height + 1, node_hash(left, node[1]))
        self.nodes.append(node)
        self.size += 1

    def root(self):
        if not self.nodes:
            return sha256(b"")
        root = self.nodes[-1][1]
        for _, left in reversed(self.nodes[:-1]):
            root = node_hash(left, root)
        return root


def verify_inclusion(index, size, leaf, path, root):  # RFC 9162 2.1.3.2
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(first, second, path, first_root, second_root):  # RFC 9162 2.1.4.2
    if first > second:
        return False
    if first == second:
        return not path and first_root == second_root
    if first == 0:
        return not path
    if not path:
        return False
    if first & (first - 1) == 0:
        path = [first_root] + path
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_root and sr == second_root and sn == 0


# ---- Keys and signed notes (c2sp.org/signed-note, c2sp.org/tlog-checkpoint).


def load_key(path, fingerprint):
    try:
        name, key_id, key = open(path, encoding="utf-8").read().strip().split("+", 2)
        raw = base64.b64decode(key, validate=True)
    except (OSError, ValueError) as e:
        raise Failure(SIGNATURE, None, f"public-key.vkey is unreadable: {e}")
    if len(raw) != 33 or raw[0] != 0x01:
        raise Failure(SIGNATURE, None, "public-key.vkey is not an Ed25519 key")
    public = raw[1:]
    if fingerprint is None:
        print(f"WARNING: no --key-fingerprint given: trusting the export's own key, fingerprint {hashlib.sha256(public).hexdigest()}; a forger can ship their own key, so compare it with the one you recorded")
    elif hashlib.sha256(public).hexdigest() != fingerprint.strip().lower():
        raise Failure(SIGNATURE, None, "the export's public key does not have the fingerprint you gave")
    expected_id = sha256(name.encode() + b"\n\x01" + public)[:4]
    if expected_id.hex() != key_id:
        raise Failure(SIGNATURE, None, "the key id in public-key.vkey does not match the key")
    return name, expected_id, public


def split_notes(text):
    notes, current, in_signatures = [], [], False
    for line in text.split("\n"):
        if line == "":
            if in_signatures:
                notes.append("\n".join(current) + "\n")
                current, in_signatures = [], False
            elif current:
                current.append("")
                in_signatures = True
            continue
        current.append(line)
    if current:
        raise Failure(SIGNATURE, None, "checkpoints.txt ends in the middle of a note")
    return notes


def verify_note(note, key):
    name, key_id, public = key
    text, _, signatures = note.rpartition("\n\n")
    text += "\n"
    lines = text.split("\n")
    if len(lines) < 4 or not lines[0] or not lines[1].isdigit() or (len(lines[1]) > 1 and lines[1][0] == "0"):
        raise Failure(SIGNATURE, None, "a checkpoint is malformed")
    try:
        root = base64.b64decode(lines[2], validate=True)
    except ValueError:
        root = b""
    if len(root) != 32:
        raise Failure(SIGNATURE, None, "a checkpoint root is not 32 bytes of base64")
    good = False
    for line in signatures.split("\n"):
        if not line:
            continue
        if not line.startswith("\u2014 "):
            raise Failure(SIGNATURE, None, "a signature line does not start with an em dash")
        signer, _, sig = line[2:].partition(" ")
        try:
            sig = base64.b64decode(sig, validate=True)
        except ValueError:
            raise Failure(SIGNATURE, None, "a signature is not base64")
        if signer != name or sig[:4] != key_id:
            continue  # another key's signature: ignored, as the spec says
        if not ed25519_verify(public, text.encode(), sig[4:]):
            raise Failure(SIGNATURE, None, f"the signature on the checkpoint at size {lines[1]} does not verify")
        good = True
    if not good:
        raise Failure(SIGNATURE, None, f"the checkpoint at size {lines[1]} carries no signature by the key")
    return int(lines[1]), root


# ---- Witness cosignatures (c2sp.org/tlog-cosignature, Ed25519 cosignature/v1).


def load_witness_key(text):
    try:
        name, key_id, key = text.strip().split("+", 2)
        raw = base64.b64decode(key, validate=True)
    except ValueError:
        raise Failure(SIGNATURE, None, f"--witness-key {text!r} is not `name+keyid+base64`")
    if len(raw) != 33 or raw[0] != 0x04:
        raise Failure(SIGNATURE, None, f"--witness-key {name} is not an Ed25519 cosignature key (type 0x04)")
    public = raw[1:]
    expected = sha256(name.encode() + b"\n\x04" + public)[:4]
    if expected.hex() != key_id:
        raise Failure(SIGNATURE, None, f"--witness-key {name}: the key id does not match the key")
    return name, expected, public


def cosigners(note, witness_keys):
    """The indexes of the witness keys with a valid cosignature on the note."""
    text, _, signatures = note.rpartition("\n\n")
    text += "\n"
    found = set()
    for line in signatures.split("\n"):
        if not line.startswith("\u2014 "):
            continue
        signer, _, sig = line[2:].partition(" ")
        try:
            sig = base64.b64decode(sig, validate=True)
        except ValueError:
            raise Failure(SIGNATURE, None, "a cosignature is not base64")
        for index, (name, key_id, public) in enumerate(witness_keys):
            if signer != name or sig[:4] != key_id:
                continue
            if len(sig) != 4 + 8 + 64:
                raise Failure(SIGNATURE, None, f"the cosignature of {name} has the wrong length")
            timestamp = int.from_bytes(sig[4:12], "big")
            message = f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()
            if not ed25519_verify(public, message, sig[12:]):
                raise Failure(SIGNATURE, None, f"the cosignature of witness {name} does not verify")
            found.add(index)
    return found


def check_witnesses(directory, manifest, key, roots, witness_keys, quorum):
    if "cosignatures.txt" not in manifest.get("files", {}):
        raise Failure(SIGNATURE, None, "the export holds no cosignatures.txt: no checkpoint was witnessed")
    with open(os.path.join(directory, "cosignatures.txt"), encoding="utf-8") as f:
        notes = split_notes(f.read())
    witnessed = {}
    for note in notes:
        size, root = verify_note(note, key)
        if roots.get(size) != root:
            raise Failure(TRUNCATION, None, f"a cosigned checkpoint at size {size} is not one of checkpoints.txt: fork")
        witnessed.setdefault(size, set()).update(cosigners(note, witness_keys))
    sizes = [size for size, signers in witnessed.items() if len(signers) >= quorum]
    if not sizes:
        raise Failure(SIGNATURE, None, f"no checkpoint is cosigned by {quorum} of the {len(witness_keys)} witness keys")
    return max(sizes)


# ---- A fleet export.

FLEET_FORMAT = "toolgate-fleet-export/1"
FLEET_ORIGIN = "toolgate/fleet"


def parse_vkey(text, what):
    try:
        name, key_id, key = text.strip().split("+", 2)
        raw = base64.b64decode(key, validate=True)
    except (ValueError, AttributeError):
        raise Failure(SIGNATURE, None, f"{what}: the key is unreadable")
    if len(raw) != 33 or raw[0] != 0x01:
        raise Failure(SIGNATURE, None, f"{what}: not an Ed25519 key")
    public = raw[1:]
    expected_id = sha256(name.encode() + b"\n\x01" + public)[:4]
    if expected_id.hex() != key_id:
        raise Failure(SIGNATURE, None, f"{what}: the key id does not match the key")
    return name, expected_id, public


def key_fingerprint(key):
    return hashlib.sha256(key[2]).hexdigest()


def parse_pins(values):
    """--key-fingerprint values of a fleet export: HEX (any one sidecar) or ORIGIN=HEX
    (that sidecar only). Returns (unbound fingerprints, {origin: fingerprints})."""
    unbound, bound = set(), {}
    for value in values or []:
        origin, sep, hex_ = value.rpartition("=")
        if sep:
            bound.setdefault(origin, set()).add(hex_.strip().lower())
        else:
            unbound.add(hex_.strip().lower())
    return unbound, bound


def check_sidecar_key(where, origin, key, fleet_fp, pins, used):
    """A sidecar's key: never the fleet key, never another sidecar's, and pinned (for its
    origin when an ORIGIN=HEX names it, else among the plain fingerprints)."""
    unbound, bound = pins
    fingerprint = key_fingerprint(key)
    if fingerprint == fleet_fp:
        raise Failure(SIGNATURE, None, f"{where}: its key is the fleet key (fingerprint {fingerprint}): a sidecar signs with its own key")
    if used.get(fingerprint, origin) != origin:
        raise Failure(SIGNATURE, None, f"{where}: its key (fingerprint {fingerprint}) also signs for sidecar {used[fingerprint]}: each sidecar has its own key")
    used[fingerprint] = origin
    if origin in bound:
        if fingerprint not in bound[origin]:
            raise Failure(SIGNATURE, None, f"{where}: its key (fingerprint {fingerprint}) is not the one you pinned for it")
    elif (unbound or bound) and fingerprint not in unbound:
        raise Failure(SIGNATURE, None, f"{where}: its key (fingerprint {fingerprint}) is not one of the fingerprints you gave")


def check_fleet_witnesses(directory, fleet, signer_key, fleet_size, fleet_root, witness_keys, quorum):
    """The largest fleet checkpoint cosigned by `quorum` of the witness keys, which the
    exported fleet checkpoint must extend (its consistency proof in the manifest)."""
    path = os.path.join(directory, "fleet-cosignatures.txt")
    if not os.path.exists(path):
        raise Failure(SIGNATURE, None, "the export holds no fleet-cosignatures.txt: no fleet checkpoint was witnessed")
    with open(path, encoding="utf-8") as f:
        notes = split_notes(f.read())
    witnessed = {}
    for note in notes:
        if not note.startswith(f"{FLEET_ORIGIN}\n"):
            raise Failure(INTEGRITY, None, "fleet-cosignatures.txt holds a note that is not a toolgate/fleet checkpoint")
        size, root = verify_note(note, signer_key)
        signers = cosigners(note, witness_keys)
        entry = witnessed.setdefault(size, (root, set()))
        if entry[0] != root:
            raise Failure(SIGNATURE, None, f"two cosigned fleet checkpoints of size {size} have different roots: the fleet log forked")
        entry[1].update(signers)
    sizes = [size for size, (_, signers) in witnessed.items() if len(signers) >= quorum]
    if not sizes:
        raise Failure(SIGNATURE, None, f"no fleet checkpoint is cosigned by {quorum} of the {len(witness_keys)} witness keys")
    size = max(sizes)
    if not fleet_extends(fleet, fleet_size, fleet_root, size, witnessed[size][0]):
        raise Failure(TRUNCATION, None, f"the exported fleet checkpoint (size {fleet_size}) does not extend the fleet checkpoint the witnesses cosigned at size {size}: fork")
    return size


def fleet_extends(fleet, fleet_size, fleet_root, size, root):
    """Whether the manifest's consistency proof shows that the exported fleet
    checkpoint extends the fleet checkpoint (size, root)."""
    proofs = {p.get("size"): p for p in fleet.get("cosigned") or []}
    proof = proofs.get(size)
    hashes = [bytes.fromhex(h) for h in proof.get("consistency") or []] if proof else None
    return hashes is not None and verify_consistency(size, fleet_size, hashes, root, fleet_root)


def check_fleet_trusted(note, fleet, fleet_key, fleet_size, fleet_root, sidecars):
    """The auditor's trusted checkpoint against a fleet export: a fleet checkpoint (the
    exported one extends it: the same one, or one the manifest holds a consistency
    proof from), or a sidecar's (its checkpoint in the export is at that size, with
    that root). Anything the export cannot show is a failure (2), never skipped.
    `sidecars` maps origin to (key, size, root)."""
    origin = note.split("\n", 1)[0]
    if origin == FLEET_ORIGIN:
        size, root = verify_note(note, fleet_key)
        if size > fleet_size:
            raise Failure(TRUNCATION, None, f"your trusted fleet checkpoint covers {size} sidecar checkpoints but the export's fleet log has {fleet_size}: the fleet log was cut")
        if size == fleet_size:
            if root != fleet_root:
                raise Failure(TRUNCATION, None, f"the export's fleet checkpoint at size {size} differs from your trusted one: fork")
            return
        if not fleet_extends(fleet, fleet_size, fleet_root, size, root):
            raise Failure(TRUNCATION, None, f"the export holds no consistency proof from your trusted fleet checkpoint (size {size}) to its own: it cannot show that it extends it")
        return
    if origin not in sidecars:
        raise Failure(TRUNCATION, None, f"your trusted checkpoint is of `{origin}`, neither the fleet log nor a sidecar of this export: it cannot show that it extends it")
    key, exported_size, exported_root = sidecars[origin]
    size, root = verify_note(note, key)
    if size > exported_size:
        raise Failure(TRUNCATION, exported_size + 1, f"sidecar {origin}: your trusted checkpoint covers {size} events but the export's checkpoint {exported_size}: seq {exported_size + 1}..{size} were cut")
    if size < exported_size:
        raise Failure(TRUNCATION, None, f"sidecar {origin}: the export holds no checkpoint at the size of your trusted one ({size}): it cannot show that it extends it")
    if root != exported_root:
        raise Failure(TRUNCATION, None, f"sidecar {origin}: the export's checkpoint at size {size} differs from your trusted one: fork")


def verify_fleet(directory, manifest, raw_manifest, fingerprints, fleet_fingerprint=None, trusted_note=None, witness_keys=None, quorum=None, expect_full=False, expect_run=None):
    pins = parse_pins(fingerprints)
    if not pins[0] and not pins[1]:
        print("WARNING: no --key-fingerprint given: the sidecars' keys in the export are trusted as found")
    run_id = manifest.get("run_id")
    fleet = manifest.get("fleet") or {}
    signer_key = parse_vkey(fleet.get("signer_vkey") or "", f"the fleet signer {fleet.get('signer')}")
    fleet_fp = key_fingerprint(signer_key)
    if fleet_fingerprint is None:
        print(f"WARNING: no --fleet-key-fingerprint given: trusting the export's own fleet key, fingerprint {fleet_fp}; a forger can ship their own key, so compare it with the one `toolgate audit fleet-key` printed")
    elif fleet_fp != fleet_fingerprint.strip().lower():
        raise Failure(SIGNATURE, None, f"the fleet signer's key (fingerprint {fleet_fp}) is not the --fleet-key-fingerprint you gave")
    # The manifest is the fleet key's signed statement of every event of the run.
    check_manifest_signature(directory, raw_manifest, signer_key, FLEET_MANIFEST_DOMAIN)
    if expect_full:
        raise Failure(INTEGRITY, None, "a fleet export is the export of one run, never a full export: use --expect-run")
    complete = manifest.get("complete") is True
    held = ", ".join(f"{u.get('origin')} (from seq {u.get('since_seq')}; the hub holds up to {u.get('hub_size')})" for u in manifest.get("unshipped") or [])
    if expect_run is not None and run_id != expect_run:
        raise Failure(INTEGRITY, None, f"you expect the complete export of run {expect_run} but the signed manifest is of run {run_id}")
    if expect_run is not None and not complete:
        raise Failure(INTEGRITY, None, f"you expect the complete export of run {expect_run} but the signed manifest says it is not complete: sidecars hold events of the run the hub did not have when it was made: {held or 'events above the fleet checkpoint it is cut at'}")
    listed_dirs = {s.get("dir") for s in manifest.get("sidecars") or []}
    sidecars_dir = os.path.join(directory, "sidecars")
    for entry in sorted(os.listdir(sidecars_dir)) if os.path.isdir(sidecars_dir) else []:
        if f"sidecars/{entry}" not in listed_dirs:
            raise Failure(INTEGRITY, None, f"sidecars/{entry} is not in the signed manifest")
    with open(os.path.join(directory, "fleet-checkpoint.txt"), encoding="utf-8") as f:
        fleet_note = f.read()
    if not fleet_note.startswith(f"{FLEET_ORIGIN}\n"):
        raise Failure(INTEGRITY, None, "fleet-checkpoint.txt is not a toolgate/fleet checkpoint")
    fleet_size, fleet_root = verify_note(fleet_note, signer_key)
    if fleet_size != fleet.get("size") or fleet_root.hex() != fleet.get("root"):
        raise Failure(INTEGRITY, None, "the manifest names another fleet checkpoint than fleet-checkpoint.txt")
    total, used, checked = 0, {}, {}
    for sidecar in manifest.get("sidecars") or []:
        origin = sidecar.get("origin")
        where = f"sidecar {origin}"
        if origin in checked:
            raise Failure(INTEGRITY, None, f"{where} is listed twice in the signed manifest")
        key = parse_vkey(sidecar.get("vkey") or "", where)
        check_sidecar_key(where, origin, key, fleet_fp, pins, used)
        base = os.path.join(directory, sidecar["dir"])
        with open(os.path.join(base, "checkpoint.txt"), encoding="utf-8") as f:
            note = f.read()
        if not note.startswith(f"{origin}\n"):
            raise Failure(INTEGRITY, None, f"{where}: its checkpoint is of another origin")
        size, root = verify_note(note, key)
        checked[origin] = (key, size, root)
        path = [bytes.fromhex(h) for h in sidecar.get("fleet_path") or []]
        if not verify_inclusion(sidecar.get("fleet_leaf_index", -1), fleet_size, leaf_hash(note.encode()), path, fleet_root):
            raise Failure(INTEGRITY, None, f"{where}: its checkpoint is not in the signed fleet checkpoint")
        proofs = {p["seq"]: p for p in read_jsonl(os.path.join(base, "proofs.jsonl"))}
        with open(os.path.join(base, "events.jsonl"), "rb") as f:
            raw = f.read()
        if raw and not raw.endswith(b"\n"):
            raise Failure(INTEGRITY, None, f"{where}: {sidecar['dir']}/events.jsonl does not end with a newline: bytes were added after its last line")
        lines = raw.split(b"\n")[:-1] if raw else []
        last = 0
        for number, line in enumerate(lines, start=1):
            try:
                event = json.loads(line.decode("utf-8"))
                seq = event["seq"]
            except (ValueError, KeyError, TypeError):
                raise Failure(INTEGRITY, None, f"{where}: line {number} of events.jsonl is not an event")
            if not jcs_safe(event) or canonical(event).encode("utf-8") != line:
                raise Failure(INTEGRITY, seq, f"{where}: the line is not canonical JSON: it was edited")
            if event.get("run_id") != run_id:
                raise Failure(INTEGRITY, seq, f"{where}: the event does not belong to run {run_id}")
            if seq <= last:
                raise Failure(INTEGRITY, seq, f"{where}: events.jsonl is out of order")
            proof = proofs.get(seq)
            hashes = [bytes.fromhex(h) for h in proof["path"]] if proof else []
            if not proof or proof.get("tree_size") != size or not verify_inclusion(seq - 1, size, leaf_hash(line), hashes, root):
                raise Failure(INTEGRITY, seq, f"{where}: the event is not in the sidecar's signed checkpoint: edited or forged")
            last = seq
        seqs = [json.loads(line.decode("utf-8"))["seq"] for line in lines]
        hashes = [leaf_hash(line).hex() for line in lines]
        if seqs != sidecar.get("seqs") or hashes != sidecar.get("leaf_hashes"):
            missing = sorted(set(sidecar.get("seqs") or []) - set(seqs))
            at = missing[0] if missing else None
            raise Failure(INTEGRITY, at, f"{where}: events.jsonl does not hold exactly the events the signed manifest lists")
        if len(lines) != sidecar.get("events"):
            raise Failure(INTEGRITY, None, f"{where}: the manifest counts {sidecar.get('events')} events but events.jsonl has {len(lines)}")
        total += len(lines)
    # Last, so that a line dropped or edited is named by its sidecar and seq above;
    # this catches whatever else changed in a file the manifest vouches for.
    required = ["fleet-checkpoint.txt"]
    for sidecar in manifest.get("sidecars") or []:
        required += [f"{sidecar.get('dir')}/{name}" for name in ("events.jsonl", "proofs.jsonl", "checkpoint.txt")]
    if os.path.exists(os.path.join(directory, "fleet-cosignatures.txt")):
        required.append("fleet-cosignatures.txt")
    check_files(directory, manifest, required)
    if trusted_note is not None:
        check_fleet_trusted(trusted_note, fleet, signer_key, fleet_size, fleet_root, checked)
    witnessed = ""
    if witness_keys:
        keys = [load_witness_key(k) for k in witness_keys]
        need = len(keys) if quorum is None else quorum
        if need < 1 or need > len(keys):
            raise Failure(SIGNATURE, None, f"--quorum {need} must be between 1 and the {len(keys)} witness keys")
        size = check_fleet_witnesses(directory, fleet, signer_key, fleet_size, fleet_root, keys, need)
        witnessed = f", witnessed up to fleet size {size} by {need} of {len(keys)} witnesses"
    if not complete:
        print(f"WARNING: the signed manifest says this export of run {run_id} is not complete: sidecars hold events of the run the hub did not have when it was made: {held or 'events above the fleet checkpoint it is cut at'}")
    return f"OK: fleet export of run {run_id}, {total} events from {len(manifest.get('sidecars') or [])} sidecars, fleet size {fleet_size}{witnessed}{'' if complete else ' (NOT complete)'}"


# ---- The export.


def read_jsonl(path):
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().splitlines()]


EXPORT_FILES = ("events.jsonl", "checkpoints.txt", "public-key.vkey", "proofs/inclusion.jsonl", "proofs/consistency.jsonl")


def check_files(directory, manifest, required=EXPORT_FILES):
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise Failure(INTEGRITY, None, "manifest.json lists no files with their sha256")
    for name in required:
        if name not in files:
            raise Failure(INTEGRITY, None, f"manifest.json lists no {name}")
    for name, digest in sorted(files.items()):
        if os.path.isabs(name) or ".." in name.split("/"):
            raise Failure(INTEGRITY, None, f"manifest.json names a file outside the export: {name}")
        try:
            with open(os.path.join(directory, name), "rb") as f:
                actual = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            raise Failure(INTEGRITY, None, f"{name} is missing")
        if actual != digest:
            raise Failure(INTEGRITY, None, f"{name} does not match its sha256 in manifest.json")


def check_manifest_signature(directory, raw_manifest, key, domain=MANIFEST_DOMAIN):
    name, key_id, public = key
    try:
        with open(os.path.join(directory, "manifest.sig"), encoding="utf-8") as f:
            signer, _, sig = f.read().strip().partition(" ")
        sig = base64.b64decode(sig, validate=True)
    except (OSError, ValueError):
        raise Failure(SIGNATURE, None, "manifest.sig is missing or unreadable: the manifest is not a signed statement")
    if signer != name or sig[:4] != key_id or not ed25519_verify(public, domain + raw_manifest, sig[4:]):
        raise Failure(SIGNATURE, None, "the signature of manifest.json does not verify: the manifest was altered or signed by another key")


def check_expectations(manifest, expect_full, expect_run):
    flt = manifest.get("filter") or {}
    if expect_full and manifest.get("full") is not True:
        raise Failure(INTEGRITY, None, "you expect a full export but the signed manifest says it is filtered")
    if expect_run is not None:
        if flt.get("run_id") != expect_run or flt.get("since") is not None or flt.get("until") is not None:
            raise Failure(INTEGRITY, None, f"you expect the complete export of run {expect_run} but the signed manifest's filter is {json.dumps(flt)}")


def read_trusted(path):
    """The newest note of the trusted checkpoint file; a file that cannot be read or
    holds no note is an error, whatever the export."""
    try:
        with open(path, encoding="utf-8") as f:
            notes = split_notes(f.read())
    except (OSError, ValueError) as e:
        raise Failure(INTEGRITY, None, f"the trusted checkpoint `{path}` is unreadable: {e}")
    if not notes:
        raise Failure(INTEGRITY, None, f"the trusted checkpoint file `{path}` holds no checkpoint")
    return notes[-1]


def verify(directory, fingerprint, trusted_path=None, expect_full=False, expect_run=None, witness_keys=None, quorum=None, fleet=False, fleet_fingerprint=None):
    if isinstance(fingerprint, str):
        fingerprint = [fingerprint]
    fingerprint = fingerprint or []
    trusted_note = read_trusted(trusted_path) if trusted_path else None
    try:
        with open(os.path.join(directory, "manifest.json"), "rb") as f:
            raw_manifest = f.read()
        manifest = json.loads(raw_manifest.decode("utf-8"))
    except (OSError, ValueError) as e:
        raise Failure(INTEGRITY, None, f"manifest.json is unreadable: {e}")
    # The auditor says which kind of export they verify; the manifest does not choose.
    is_fleet = manifest.get("format") == FLEET_FORMAT
    if is_fleet and not fleet:
        raise Failure(INTEGRITY, None, f"manifest.json says {FLEET_FORMAT}: verify a fleet export with --fleet (and pin its key with --fleet-key-fingerprint)")
    if fleet and not is_fleet:
        raise Failure(INTEGRITY, None, f"you expect a fleet export (--fleet) but manifest.json's format is {manifest.get('format')!r}")
    if fleet:
        return verify_fleet(directory, manifest, raw_manifest, fingerprint, fleet_fingerprint, trusted_note, witness_keys, quorum, expect_full, expect_run)
    if fleet_fingerprint is not None:
        raise Failure(INTEGRITY, None, "--fleet-key-fingerprint applies to a fleet export only (--fleet)")
    if any("=" in f for f in fingerprint):
        raise Failure(INTEGRITY, None, "--key-fingerprint ORIGIN=HEX applies to a fleet export only (--fleet)")
    key = load_key(os.path.join(directory, "public-key.vkey"), fingerprint[-1] if fingerprint else None)
    check_manifest_signature(directory, raw_manifest, key)
    check_expectations(manifest, expect_full, expect_run)
    check_files(directory, manifest)
    trusted = verify_note(trusted_note, key) if trusted_note is not None else None

    # Checkpoints: every signature, then consistency between neighbours.
    with open(os.path.join(directory, "checkpoints.txt"), encoding="utf-8") as f:
        checkpoints = [verify_note(note, key) for note in split_notes(f.read())]
    if not checkpoints:
        raise Failure(TRUNCATION, None, "the export holds no checkpoint")
    for (size_a, _), (size_b, _) in zip(checkpoints, checkpoints[1:]):
        if size_b <= size_a:
            raise Failure(INTEGRITY, None, "checkpoints.txt is not in increasing size order")
    proofs = {(p["from"], p["to"]): [bytes.fromhex(h) for h in p["path"]] for p in read_jsonl(os.path.join(directory, "proofs/consistency.jsonl"))}
    for (size_a, root_a), (size_b, root_b) in zip(checkpoints, checkpoints[1:]):
        if not verify_consistency(size_a, size_b, proofs.get((size_a, size_b), []), root_a, root_b):
            raise Failure(TRUNCATION, size_a + 1, f"the checkpoint at size {size_b} is not consistent with the one at size {size_a}: fork")
    tree_size, tree_root = checkpoints[-1]
    if manifest.get("tree_size") != tree_size:
        raise Failure(TRUNCATION, None, f"manifest.json claims tree size {manifest.get('tree_size')} but the newest checkpoint has {tree_size}")
    roots = dict(checkpoints)
    signed_cp = manifest.get("checkpoint") or {}
    if signed_cp.get("size") != tree_size or signed_cp.get("root") != tree_root.hex():
        raise Failure(INTEGRITY, None, "the signed manifest names another checkpoint than the newest in checkpoints.txt")
    if trusted is not None:
        trusted_size, trusted_root = trusted
        if trusted_size > tree_size:
            raise Failure(TRUNCATION, tree_size + 1, f"your trusted checkpoint covers {trusted_size} events but the export's log has {tree_size}: seq {tree_size + 1}..{trusted_size} were cut")
        if trusted_size in roots and roots[trusted_size] != trusted_root:
            raise Failure(TRUNCATION, None, f"the export's checkpoint at size {trusted_size} differs from your trusted one: fork")
        if trusted_size not in roots and not manifest.get("full") is True:
            raise Failure(TRUNCATION, None, f"the export holds no checkpoint at the size of your trusted one ({trusted_size}): it cannot show that it extends it")

    # Events.
    with open(os.path.join(directory, "events.jsonl"), "rb") as f:
        raw = f.read()
    if raw and not raw.endswith(b"\n"):
        raise Failure(INTEGRITY, None, "events.jsonl does not end with a newline")
    lines = raw.split(b"\n")[:-1] if raw else []
    inclusion = {p["seq"]: p for p in read_jsonl(os.path.join(directory, "proofs/inclusion.jsonl"))}
    full = manifest.get("full") is True
    frontier, prev, last_seq = Frontier(), GENESIS_PREV, 0
    for number, line in enumerate(lines, start=1):
        try:
            event = json.loads(line.decode("utf-8"))
            seq = event["seq"]
        except (ValueError, KeyError, TypeError):
            raise Failure(INTEGRITY, last_seq + 1, f"line {number} of events.jsonl is not an event")
        if not jcs_safe(event) or canonical(event).encode("utf-8") != line:
            raise Failure(INTEGRITY, seq, "the line is not canonical JSON: it was edited")
        leaf = leaf_hash(line)
        if full:
            if seq > number:
                raise Failure(INTEGRITY, number, f"seq {number} is missing (the next line is seq {seq})")
            if seq < number:
                raise Failure(INTEGRITY, seq, f"seq {seq} appears again at line {number}: inserted or reordered")
            if event.get("prev") != prev:
                raise Failure(INTEGRITY, max(seq - 1, 1), f"seq {seq}'s prev does not match the hash of the line before: edited")
            if event.get("event_id") != f"ev-{seq:012d}":
                raise Failure(INTEGRITY, seq, "the event_id does not match the seq")
            frontier.push(leaf)
            prev = leaf.hex()
            if seq in roots and frontier.root() != roots[seq]:
                raise Failure(INTEGRITY, seq, f"the events up to seq {seq} do not match the signed checkpoint at that size")
            if trusted is not None and seq == trusted[0] and frontier.root() != trusted[1]:
                raise Failure(TRUNCATION, None, f"the events up to seq {seq} do not match your trusted checkpoint: fork")
        else:
            if seq <= last_seq:
                raise Failure(INTEGRITY, seq, "events.jsonl is out of order")
            proof = inclusion.get(seq)
            path = [bytes.fromhex(h) for h in proof["path"]] if proof else []
            if not proof or proof.get("tree_size") != tree_size or not verify_inclusion(seq - 1, tree_size, leaf, path, tree_root):
                raise Failure(INTEGRITY, seq, "the event is not in the signed log as shown: its inclusion proof fails")
        last_seq = seq
    if full and len(lines) < tree_size:
        raise Failure(TRUNCATION, len(lines) + 1, f"the signed checkpoint covers {tree_size} events but the export ends at seq {len(lines)}: truncated")
    if full and len(lines) > tree_size:
        raise Failure(INTEGRITY, tree_size + 1, "events beyond the signed checkpoint")
    if manifest.get("counts", {}).get("events") != len(lines):
        raise Failure(INTEGRITY, None, "manifest.json counts a different number of events")
    if not full:
        check_filtered(manifest, lines)
    kind = "full" if full else "filtered"
    span = f"seq {json.loads(lines[0])['seq']}..{last_seq}" if lines else "no events"
    witnessed = ""
    if witness_keys:
        keys = [load_witness_key(k) for k in witness_keys]
        need = len(keys) if quorum is None else quorum
        if need < 1 or need > len(keys):
            raise Failure(SIGNATURE, None, f"--quorum {need} must be between 1 and the {len(keys)} witness keys")
        size = check_witnesses(directory, manifest, key, roots, keys, need)
        witnessed = f", witnessed up to size {size} by {need} of {len(keys)} witnesses"
    return f"OK: {kind} export, {len(lines)} events ({span}), {len(checkpoints)} checkpoints, tree size {tree_size}{witnessed}"


def check_filtered(manifest, lines):
    """Every event matches the signed filter; every requested call is closed in the
    export or listed as still open by the signed manifest."""
    flt = manifest.get("filter") or {}
    open_calls = set(manifest.get("open_calls") or [])
    requested = {}
    for line in lines:
        event = json.loads(line)
        seq = event["seq"]
        if flt.get("run_id") is not None and event.get("run_id") != flt["run_id"]:
            raise Failure(INTEGRITY, seq, "the event does not belong to the signed filter's run")
        ts = event.get("timestamp_utc") or ""
        if (flt.get("since") is not None and ts < flt["since"]) or (flt.get("until") is not None and ts >= flt["until"]):
            raise Failure(INTEGRITY, seq, "the event is outside the signed filter's time range")
        call = event.get("call_id")
        if event.get("type") == "tool_requested" and call:
            requested[call] = seq
        elif event.get("type") in CLOSING_TYPES and call:
            requested.pop(call, None)
    for call, seq in sorted(requested.items(), key=lambda item: item[1]):
        if call not in open_calls:
            raise Failure(INTEGRITY, seq, f"call {call} was requested but its closing event is not in the export")


BUNDLE_FORMAT = "toolgate-audit-export-bundle/1"
BUNDLE_FILES = ("events.jsonl", "checkpoints.txt", "public-key.vkey", "proofs/inclusion.jsonl",
                "proofs/consistency.jsonl", "manifest.json", "manifest.sig", "README.txt",
                "verify_export.py", "events.csv", "cosignatures.txt")
MAX_BUNDLE_BYTES = 1 << 30


def unpack_bundle(path, directory):
    """Writes the files of the bundle at `path` into `directory`. Only the known names
    are accepted; their content is checked afterwards like any export's (the signed
    manifest's sha256 of every file)."""
    if os.path.getsize(path) > MAX_BUNDLE_BYTES:
        raise Failure(INTEGRITY, None, f"the bundle is larger than {MAX_BUNDLE_BYTES} bytes")
    with open(path, encoding="utf-8") as f:
        try:
            bundle = json.load(f)
        except ValueError as e:
            raise Failure(INTEGRITY, None, f"the bundle is not JSON: {e}")
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise Failure(INTEGRITY, None, f"the file is not a {BUNDLE_FORMAT} bundle")
    files = bundle.get("files")
    if not isinstance(files, dict):
        raise Failure(INTEGRITY, None, "the bundle has no `files` object")
    os.makedirs(os.path.join(directory, "proofs"))
    for name, text in files.items():
        if name not in BUNDLE_FILES or not isinstance(text, str):
            raise Failure(INTEGRITY, None, f"the bundle holds an unexpected file `{name}`")
        with open(os.path.join(directory, name), "w", encoding="utf-8", newline="") as out:
            out.write(text)


def main():
    parser = argparse.ArgumentParser(description="Verify a toolgate audit export (a directory or a bundle file).")
    parser.add_argument("export_dir")
    parser.add_argument("--key-fingerprint", action="append", help="hex sha256 of the raw Ed25519 public key (get it from the operator, not from the export); for a fleet export, a sidecar's key, repeatable, or ORIGIN=HEX to bind it to that sidecar")
    parser.add_argument("--fleet", action="store_true", help="verify a fleet export (toolgate audit export --cluster-db); refused without it, and a non-fleet export is refused with it")
    parser.add_argument("--fleet-key-fingerprint", metavar="HEX", help="with --fleet: the fleet key's fingerprint (toolgate audit fleet-key); no sidecar may use that key")
    parser.add_argument("--trusted-checkpoint", help="a checkpoint note you kept; the export must extend it")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--expect-full", action="store_true", help="fail unless the signed manifest says this is a full export")
    group.add_argument("--expect-run", metavar="RUN_ID", help="fail unless the signed manifest says this is the complete export of this run")
    parser.add_argument("--witness-key", action="append", default=[], help="a witness's cosignature key (name+keyid+base64, type 0x04); repeatable")
    parser.add_argument("--quorum", type=int, help="how many of the --witness-key must cosign one checkpoint (default: all)")
    args = parser.parse_args()
    try:
        if os.path.isfile(args.export_dir):
            with tempfile.TemporaryDirectory(prefix="toolgate-bundle-") as directory:
                unpack_bundle(args.export_dir, directory)
                print(verify(directory, args.key_fingerprint, args.trusted_checkpoint, args.expect_full, args.expect_run, args.witness_key, args.quorum, args.fleet, args.fleet_key_fingerprint))
        else:
            print(verify(args.export_dir, args.key_fingerprint, args.trusted_checkpoint, args.expect_full, args.expect_run, args.witness_key, args.quorum, args.fleet, args.fleet_key_fingerprint))
        return INTACT
    except Failure as f:
        where = f" at seq {f.seq}" if f.seq is not None else ""
        print(f"FAILED{where}: {f.message}")
        return f.code
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"FAILED: the export is malformed: {e}")
        return INTEGRITY


if __name__ == "__main__":
    sys.exit(main())
