// Package leases is the durable record of phasegate's network slots.
//
// With it a restart of the daemon (an upgrade, a crash, kill -9) can tell
// the slots it handed out from the ones it leaked, and leave the first
// untouched (DESIGN.md, section 5b). Nomad's client keeps its allocations across
// restarts the same way (client/state.db) and containerd its sandboxes
// (meta.db, with the record written before the namespace: containerd/cri#568);
// E2B's orchestrator cannot (e2b-dev/infra#1215).
//
// # What is recorded
//
// One Record per slot index: Idle (warm in the pool), Leased (owner,
// lease id, the client's request id, when acquired, TTL and expiry) or
// Held (found with something living in it that no record vouched for:
// kept until an operator acts, with since when and why), the
// kernel identity of its objects (the netns file's device and inode, the
// host veth's ifindex), so that a namespace recreated under the same name is
// never taken for the recorded one, and when the slot was made. The file
// lives in the daemon's state directory, on tmpfs (/run) by default: the
// records vanish at a reboot exactly when the namespaces do.
//
// # Layout
//
// One bbolt file (go.etcd.io/bbolt), schema 7, and its journal beside it
// (<path>.journal, below):
//
//	meta/
//	    schema     -> "7"                     ASCII decimal
//	    created    -> RFC 3339                when the file was made
//	    upgraded   -> "1 -> 2 at <RFC 3339>"  the last upgrade, if any
//	    generation -> 16 hex digits           names the store (loss.go)
//	    closed     -> RFC 3339                set by Close, removed by Open
//	    lost       -> JSON JournalLoss        a loss Open found, until ClearLoss
//	    unvouched  -> RFC 3339                set when made, until Vouched
//	slots/
//	    <index: uint32 big-endian> -> Record (protobuf, internal/recordpb)
//	requests/
//	    <len(owner): uint16 BE><owner><request id> -> <index: uint32 BE>
//
// Slot keys sort in index order, so Load returns records by index. The
// requests bucket is a secondary index over the leased records that carry a
// request id: ByRequest is one B+tree lookup (O(log n)), and a request can
// be held by one slot only (*DuplicateRequestError), which makes a retried
// Acquire find the slot its first attempt got. Every write keeps the index
// and the records in step, in the same journal entry and the same
// transaction.
//
// Records are protobuf (record.proto): fields are only ever added, a reader
// skips fields it does not know, and Update writes them back untouched, so
// a newer minor version and an older one can share a file. A change an
// older reader would misread (a new State, a new meaning) is a new schema.
//
// # Schema and upgrades
//
// meta/schema holds the layout's version. Schema 1 had meta and slots only
// (a lookup by request scanned the slots, and did not keep requests
// unique); schema 2 adds the requests index; schema 3 names the principal
// of every lease; schema 4 changes no bucket but keeps the latest writes in
// the journal beside the file, which a build that does not read it must
// not open without (it would miss them); schema 5 records a certificate's
// principal with the kind of its identity ("x509:uri:…", "x509:dns:…",
// "x509:cn:…"), which an older build would take for an identity of its
// own form; schema 7 adds the Held state, the generation, the closed mark
// and the journal's header (an older build would read the header as a
// damaged entry). Open reads the version and:
//
//   - no buckets at all (a new or empty file): writes schema 7 (Fresh);
//   - current: checks the file and opens it;
//   - older: checks it, copies it to <path>.schema<N>.bak (fsynced), then
//     runs every migration from N in one transaction that ends by writing
//     the new version: the file is upgraded whole or not at all. 1 -> 2
//     builds the index; where two records hold one request, the lower index
//     keeps it (what schema 1's scan answered); 3 -> 4, 4 -> 5 and
//     5 -> 6 write the version; to 7 the journal of schema 4 to 6 (no
//     header) goes into the file in the same transaction, which marks
//     the file closed and draws its generation;
//   - newer: refuses with *SchemaError, which names the path, the version
//     found and the version supported, in one line, and changes nothing.
//
// 4 -> 5 rewrites no record: what schema 4 wrote, in the file or in its
// journal, cannot be rewritten in the one transaction of an upgrade. Every
// leased record written since carries principal_kinds instead; a leased
// record without it whose principal is "x509:<identity>" is read as
// "legacy:x509:<identity>" ([LegacyCertificate]), so that a certificate
// whose identity of another kind is the same string is not its principal.
// Such a lease is renewed and released by a principal the policy lets
// lease for its owner (root, or the certificate that took it, if its rule
// still grants the owner); a retry of its request by that certificate is
// refused as another principal's.
//
// # Writes: durability, order, batching
//
// Put, Delete and Update return only once their changes are in the
// journal: one write(2) of one entry (journal.go) for the whole group of
// writes committed together, fdatasync'd first where the store fsyncs. The
// daemon writes a slot's Leased record before it replies to Acquire, and
// deletes or idles it only after the slot is back (Release) or gone, so a
// crash at any instruction may leave a record for a slot never handed out
// (reclaim finds it unowned later), never a handed-out slot without its
// record.
//
// What a returned write must survive is the death of the process (kill -9
// at any instant), not of the machine: the namespaces the records describe
// die at a reboot. A write(2) that returned is in the kernel's page cache,
// which outlives the process and is seen by the next one, so after a kill
// the journal holds every write that returned and at worst one torn entry
// after them, which no writer was told of and Open drops. fsync adds only
// the survival of a kernel crash or a power loss. Options.Sync decides: by
// default (SyncAuto) entries and checkpoints are fsynced unless the file
// is on tmpfs or ramfs, where fsync is a no-op and the file dies with the
// machine anyway; on a disk they are, so that a power loss does not leave
// a torn file for the next boot to refuse. TestKillDuringWritesWithoutFsync
// kills 16 writers at random instants and finds every returned write,
// replayed from the journal.
//
// Why a journal and not a bbolt commit per group: a commit rewrites every
// page on the path to each changed key, in both buckets, and the freelist
// and the meta page, several pages and pwrites for one Acquire's record,
// where the journal writes the record once (figures: docs/BENCHMARKS.md,
// "Figures behind the network code"; BenchmarkWrite). The checkpoint
// writes the journal's changes into the file in one bbolt transaction,
// many groups at once, when the writes have paused for checkpointIdle (a
// burst of Acquires never waits for it) or when the journal holds
// maxPending changes (so that memory and the next Open's replay stay
// bounded), and at Close; then it empties the journal.
// Until then the changes are kept in memory too (pending), under the
// file's content for every read: Get, ByRequest, Load and the writes
// themselves see the records as they stand. A kill between a checkpoint's
// commit and the truncation leaves entries the file already holds; every
// change is a key's whole new value, so replaying them again changes
// nothing. A checkpoint that fails (a full filesystem) leaves the changes
// pending and in the journal, and is tried again every checkpointRetry.
//
// Concurrent writes share journal entries (group commit): the first writer
// appends at once, after one yield to the writers already runnable (they
// join its entry); writers that arrive during that append are appended
// together by the next one. A lone writer pays one append and no timer
// (bbolt's DB.Batch waits up to 10 ms to gather a batch). Within a group:
//
//   - a write refused on its own merits (invalid, duplicate request, an
//     Update function's error) changes nothing and fails alone;
//   - a write that fails after changing the group is taken out, and the
//     group is run again without it;
//   - when the append itself fails (a full filesystem, an I/O error),
//     every write in it fails with that error and none of them is applied:
//     a partial entry is truncated away, and the journal and the file hold
//     exactly what they held before.
//
// ctx is consulted before a write is queued, not after: once queued, a
// write's outcome is always reported truthfully.
//
// # Faults
//
//	fault                              Open / write returns            and then
//	not a bbolt file, random bytes     *CorruptError                   MoveAside, start fresh (below)
//	truncated, garbage in a page       *CorruptError                   same
//	bbolt panics or faults on a page   *CorruptError (recovered)       same
//	one record's bytes do not decode   Load: the rest + *RecordsError  quarantine that slot
//	newest meta page torn or damaged   opens as of the commit before   a checkpoint cut there: still in the journal
//	journal: torn entry past its reach opens without it                no writer was told of it
//	journal: damaged entry, more after *CorruptError (the journal)     MoveAside (takes the journal too)
//	journal beside a fresh file        Opened().OrphanJournal          moved aside (if it holds entries), not replayed
//	journal missing, emptied, cut      Opened().JournalLoss            safe mode: hold what lives in slots
//	  short of its reach, or another     (recorded until ClearLoss);     without a lease record; a Close
//	  store's, after no Close            whole entries replayed          before makes none of these a loss
//	unreadable (permissions, EROFS)    *AccessError                    fix, or MoveAside
//	newer schema                       *SchemaError                    exit 2 with its one line
//	another process holds the file     *LockedError (with its pid)     exit: one daemon per store
//	filesystem full                    matches ErrNoSpace and ENOSPC   reads work; writes once space is back
//	Close twice, calls after Close     nil, ErrClosed
//
// Open walks every page of the file and reads the whole journal (replayed
// into memory, not into the file: a full filesystem does not stop Open),
// then runs bbolt's consistency check
// (tx.Check), with panics recovered and memory faults on the mapping turned
// into panics (runtime/debug.SetPanicOnFault): both are linear in the file,
// a small part of a start (BenchmarkOpen, BenchmarkCheck; figures in
// docs/BENCHMARKS.md). An empty (0-byte) file is a new store: bbolt cannot tell it from
// a file made by a process that died before its first write. Its fresh
// generation is what tells the daemon its slots' records are gone: every
// slot it finds stamped with another was made under them. When bbolt
// panics inside bolt.Open itself, its mapping of the file cannot be
// released; it stays until the process exits.
//
// After a *CorruptError or an *AccessError the records are lost to the
// daemon. It cannot tell the slots it finds on the host leased from leaked,
// so the safe default is to move the file aside (MoveAside names the copy
// path.corrupt-<UTC time>), open a fresh store, and quarantine every slot it
// finds (report them, touch none) rather than reclaim them as leaks. The
// same holds for a journal Open found beside a fresh file and set aside
// (Opened.OrphanJournal). A Fresh store next to existing slots is told
// by the slots themselves: the daemon stamps each slot it makes with the
// generation of its store (Opened.Generation), so that the slots stamped
// with another were made under records that are gone, and are kept if
// something lives in them, while those stamped by none are leaks.
// KeptAside lists everything set aside, so that the daemon can report it
// and stay in safe mode while it is there. A journal found missing, emptied
// or cut short of its reach after a process ended without Close is a
// loss too (Opened.JournalLoss): the records may miss leases written
// after the last checkpoint, and the daemon holds every slot something
// lives in that has no lease record.
//
// # Use by the daemon
//
// At start, after the lock: Open, Load, classify every slot found against
// its record, then Put the restored leases with a fresh full TTL (one
// transaction), and the Held records of the slots it holds; then
// ClearLoss, if Open reported a loss. Acquire: a retry (owner, request id) is answered from the
// daemon's own leases, which Load filled and every Put since has kept (no
// read of the store per call); otherwise take a slot and Put its Leased
// record (a *DuplicateRequestError means a concurrent retry won: return its
// slot and give this one back). KeepAlive: Update comparing the lease id and setting
// Expires. Release: Update comparing the lease id and returning ErrRemove,
// then reset the slot, then Put it Idle: a crash in between leaves a slot
// without a record (reclaimed at the next start), never an Idle record for
// a slot still holding its last tenant's state, nor a lease its owner gave
// back.
package leases
