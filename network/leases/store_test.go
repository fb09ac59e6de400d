package leases

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/netns"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)

func leased(i int, owner, req string) Record {
	return Record{
		Index: i, State: Leased,
		Owner: owner, LeaseID: NewLeaseID(), RequestID: req, Principal: "uid:1000",
		Acquired: t0, TTL: 30 * time.Second, Expires: t0.Add(30 * time.Second),
		Netns: netns.ID{Dev: 4, Ino: uint64(4026532000 + i)}, HostIfindex: 100 + i,
		Created: t0.Add(-time.Minute),
	}
}

func idle(i int) Record {
	return Record{Index: i, State: Idle, Netns: netns.ID{Dev: 4, Ino: uint64(4026532000 + i)}, HostIfindex: 100 + i, Created: t0}
}

// attached is a lease of a slot attached to a runtime's namespace.
func attached(i int) Record {
	r := leased(i, "cni/pgnet", "c0ffee/eth0")
	r.TTL, r.Expires = 0, time.Time{}
	r.Attachment = &Attachment{Netns: netns.ID{Dev: 4, Ino: 4026539999}, NetnsPath: "/var/run/netns/cni-1234",
		IfName: "eth0"}
	return r
}

// policied is a lease with an egress policy.
func policied(i int) Record {
	r := leased(i, "ci", "p")
	r.Egress = &egress.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		Deny: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("203.0.113.7/32")}, RedirectTCP: true}
	r.Bandwidth = limited()
	return r
}

// accounted is a lease whose link was made again and policy written
// again: its ledger carries what the earlier ones counted.
func accounted(i int) Record {
	r := leased(i, "ci", "accounted")
	r.Ledger = account.Ledger{Carried: account.Usage{Counts: account.Counts{BytesIn: 1 << 40, PacketsIn: 1 << 30, BytesOut: 7, PacketsOut: 1},
		Dropped: 12}, Start: account.Counts{BytesOut: 90, PacketsOut: 1}}
	return r
}

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "leases.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sameRecord(t *testing.T, got, want Record) {
	t.Helper()
	if got.Index != want.Index || got.State != want.State || got.Owner != want.Owner ||
		got.LeaseID != want.LeaseID || got.RequestID != want.RequestID ||
		!got.Acquired.Equal(want.Acquired) || got.TTL != want.TTL || !got.Expires.Equal(want.Expires) ||
		got.Netns != want.Netns || got.HostIfindex != want.HostIfindex || !got.Created.Equal(want.Created) ||
		!reflect.DeepEqual(got.Attachment, want.Attachment) || !reflect.DeepEqual(got.Egress, want.Egress) ||
		!reflect.DeepEqual(got.Bandwidth, want.Bandwidth) || got.Ledger != want.Ledger {
		t.Fatalf("record differs:\n got %+v\nwant %+v", got, want)
	}
}

func TestPutGetLoadSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Opened().Fresh {
		t.Fatal("a new file is not reported Fresh")
	}
	ctx := context.Background()
	want := []Record{leased(1, "ci", "r1"), idle(2), leased(7, "ci", ""), {
		Index: 300, State: Leased, Owner: "sandbox", LeaseID: NewLeaseID(), Principal: "uid:0", Acquired: t0, // TTL 0: held until released
	}, attached(301), policied(302), accounted(303)}
	if err := s.Put(ctx, want...); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := s.Get(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
	if err := s.Put(ctx, idle(3)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close: %v, want ErrClosed", err)
	}

	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if o := s.Opened(); o.Fresh || o.UpgradedFrom != 0 || o.Backup != "" {
		t.Fatalf("reopen reports %+v", s.Opened())
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Load: %d records, want %d", len(got), len(want))
	}
	for i := range want {
		sameRecord(t, got[i], want[i])
	}
	r, ok, err := s.Get(7)
	if err != nil || !ok {
		t.Fatalf("Get(7) = %v, %v", ok, err)
	}
	sameRecord(t, r, want[2])
	if _, ok, err := s.Get(8); err != nil || ok {
		t.Fatalf("Get(8) = %v, %v; want not found", ok, err)
	}
	if _, _, err := s.Get(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Get(0): %v, want ErrInvalid", err)
	}
}

func TestPutRefusesInvalidRecords(t *testing.T) {
	s := openTemp(t)
	long := string(make([]byte, MaxIDLen+1))
	mod := func(f func(*Record)) Record { r := leased(5, "o", "q"); f(&r); return r }
	for _, tc := range []struct {
		name string
		recs []Record
	}{
		{"index 0", []Record{mod(func(r *Record) { r.Index = 0 })}},
		{"negative index", []Record{mod(func(r *Record) { r.Index = -1 })}},
		{"zero state", []Record{mod(func(r *Record) { r.State = 0 })}},
		{"unknown state", []Record{mod(func(r *Record) { r.State = 9 })}},
		{"leased without owner", []Record{mod(func(r *Record) { r.Owner = "" })}},
		{"leased without lease id", []Record{mod(func(r *Record) { r.LeaseID = "" })}},
		{"leased without acquisition time", []Record{mod(func(r *Record) { r.Acquired = time.Time{} })}},
		{"TTL without expiry", []Record{mod(func(r *Record) { r.Expires = time.Time{} })}},
		{"expiry without TTL", []Record{mod(func(r *Record) { r.TTL = 0 })}},
		{"negative TTL", []Record{mod(func(r *Record) { r.TTL = -time.Second })}},
		{"idle with owner", []Record{func() Record { r := idle(5); r.Owner = "o"; return r }()}},
		{"idle with attachment", []Record{func() Record { r := idle(5); r.Attachment = attached(5).Attachment; return r }()}},
		{"attachment without interface", []Record{func() Record { r := attached(5); r.Attachment.IfName = ""; return r }()}},
		{"attachment interface too long", []Record{func() Record { r := attached(5); r.Attachment.IfName = "sixteen-bytes-xx"; return r }()}},
		{"owner too long", []Record{mod(func(r *Record) { r.Owner = long })}},
		{"idle with a ledger", []Record{func() Record { r := idle(5); r.Ledger = accounted(5).Ledger; return r }()}},
		{"idle with egress policy", []Record{func() Record { r := idle(5); r.Egress = policied(5).Egress; return r }()}},
		{"egress lists unsorted", []Record{func() Record { r := policied(5); slices.Reverse(r.Egress.Deny); return r }()}},
		{"egress list /0", []Record{func() Record { r := policied(5); r.Egress.Allow[0] = netip.MustParsePrefix("0.0.0.0/0"); return r }()}},
		{"same index twice", []Record{idle(5), idle(5)}},
		{"same request twice", []Record{leased(5, "o", "q"), leased(6, "o", "q")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Put(context.Background(), tc.recs...); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Put: %v, want ErrInvalid", err)
			}
		})
	}
	if recs, err := s.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("after refused Puts: %d records, %v", len(recs), err)
	}
}

func TestByRequestIsIdempotentAndUnique(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	first := leased(3, "ci", "req-1")
	if err := s.Put(ctx, first); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.ByRequest("ci", "req-1")
	if err != nil || !ok {
		t.Fatalf("ByRequest = %v, %v", ok, err)
	}
	sameRecord(t, got, first)
	for _, q := range [][2]string{{"ci", "req-2"}, {"other", "req-1"}, {"ci", ""}, {"", "req-1"}} {
		if _, ok, err := s.ByRequest(q[0], q[1]); err != nil || ok {
			t.Fatalf("ByRequest(%q, %q) = %v, %v; want not found", q[0], q[1], ok, err)
		}
	}
	// The owner/request split is unambiguous: ("ab", "c") is not ("a", "bc").
	if err := s.Put(ctx, leased(4, "a", "bc")); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.ByRequest("ab", "c"); ok {
		t.Fatal(`("ab", "c") found ("a", "bc")`)
	}

	// A retry that raced its first attempt and took another slot is refused.
	err = s.Put(ctx, leased(9, "ci", "req-1"))
	var dup *DuplicateRequestError
	if !errors.As(err, &dup) || dup.Index != 3 {
		t.Fatalf("Put of a held request: %v, want *DuplicateRequestError for slot 3", err)
	}
	if _, ok, _ := s.Get(9); ok {
		t.Fatal("the refused record was written")
	}
	// Replacing the record by one of the same request keeps it indexed.
	again := leased(3, "ci", "req-1")
	if err := s.Put(ctx, again); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.ByRequest("ci", "req-1"); got.LeaseID != again.LeaseID {
		t.Fatal("the index does not find the replacement")
	}
	// Returning the slot to the pool frees the request; so does Delete.
	if err := s.Put(ctx, idle(3)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.ByRequest("ci", "req-1"); ok {
		t.Fatal("an idle slot is still found by its last request")
	}
	if err := s.Put(ctx, leased(9, "ci", "req-1")); err != nil {
		t.Fatalf("the freed request cannot be taken again: %v", err)
	}
	if err := s.Delete(ctx, 9, 9999); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.ByRequest("ci", "req-1"); ok {
		t.Fatal("a deleted record is still found by its request")
	}
	// One Put may move a request from one slot to another.
	if err := s.Put(ctx, leased(10, "ci", "mv")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, idle(10), leased(11, "ci", "mv")); err != nil {
		t.Fatalf("moving a request within one Put: %v", err)
	}
	if got, _, _ := s.ByRequest("ci", "mv"); got.Index != 11 {
		t.Fatalf("moved request found at slot %d, want 11", got.Index)
	}
	checkRequestIndex(t, s)
}

// checkRequestIndex proves the request index is exactly what the records say, and
// that no two records hold one request.
func checkRequestIndex(t *testing.T, s *Store) { checkIndexOf(t, s, false) }

// checkIndexOf with legacy allows what a schema 1 file may hold: records
// sharing a request, the lowest index holding it.
func checkIndexOf(t *testing.T, s *Store, legacy bool) {
	t.Helper()
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, r := range recs {
		if k := requestKeyOf(&r); k != nil {
			if holder, dup := want[string(k)]; dup {
				if !legacy {
					t.Fatalf("slots %d and %d hold request %q", holder, r.Index, r.RequestID)
				}
				continue
			}
			want[string(k)] = r.Index
		}
	}
	// As the store reads it (the file under the journal), then in the
	// file alone once the journal is checkpointed into it.
	indexOf := func(forEach func(func(k, v []byte) error) error) map[string]int {
		got := map[string]int{}
		if err := forEach(func(k, v []byte) error {
			i, err := parseSlotKey(v)
			got[string(k)] = i
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	var read map[string]int
	if err := s.read(func(tx *txn) error {
		read = indexOf(tx.bucket(inRequests).ForEach)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(read) != fmt.Sprint(want) {
		t.Fatalf("request index %v, records say %v", read, want)
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.db.View(func(tx *bolt.Tx) error {
		if got := indexOf(tx.Bucket(bucketRequests).ForEach); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("request index in the file after a checkpoint %v, records say %v", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestUpdateIsCompareAndSet(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	r := leased(2, "ci", "q")
	if err := s.Put(ctx, r); err != nil {
		t.Fatal(err)
	}
	errMismatch := errors.New("lease id mismatch")
	keepAlive := func(id string, now time.Time) func(*Record) error {
		return func(rec *Record) error {
			if rec.LeaseID != id {
				return errMismatch
			}
			rec.Expires = now.Add(rec.TTL)
			return nil
		}
	}
	later := t0.Add(time.Hour)
	got, err := s.Update(ctx, 2, keepAlive(r.LeaseID, later))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Expires.Equal(later.Add(30 * time.Second)) {
		t.Fatalf("Update returned expiry %v", got.Expires)
	}
	if stored, _, _ := s.Get(2); !stored.Expires.Equal(got.Expires) {
		t.Fatalf("stored expiry %v, returned %v", stored.Expires, got.Expires)
	}
	if _, err := s.Update(ctx, 2, keepAlive("not-the-lease", later)); err != errMismatch {
		t.Fatalf("Update with a wrong lease id: %v, want the function's error as it is", err)
	}
	if _, err := s.Update(ctx, 5, keepAlive(r.LeaseID, later)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update of a missing record: %v, want ErrNotFound", err)
	}
	if _, err := s.Update(ctx, 2, func(r *Record) error { r.Index = 3; return nil }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Update changing the index: %v, want ErrInvalid", err)
	}
	if _, err := s.Update(ctx, 2, func(r *Record) error { r.Owner = ""; return nil }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Update leaving an invalid record: %v, want ErrInvalid", err)
	}
	if _, err := s.Update(ctx, 2, func(r *Record) error { panic("boom") }); err == nil {
		t.Fatal("a panicking update function succeeded")
	}
	// Release: back to idle, the request freed.
	if _, err := s.Update(ctx, 2, func(rec *Record) error { *rec = idle(2); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.ByRequest("ci", "q"); ok {
		t.Fatal("released slot still found by its request")
	}
	// ErrRemove deletes.
	if got, err := s.Update(ctx, 2, func(*Record) error { return ErrRemove }); err != nil || !reflect.DeepEqual(got, Record{}) {
		t.Fatalf("Update with ErrRemove = %+v, %v", got, err)
	}
	if _, ok, _ := s.Get(2); ok {
		t.Fatal("ErrRemove left the record")
	}
	checkRequestIndex(t, s)
}

func TestCanceledContextWritesNothing(t *testing.T) {
	s := openTemp(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, idle(1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put: %v", err)
	}
	if _, err := s.Update(ctx, 1, func(*Record) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Update: %v", err)
	}
	if err := s.Delete(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Delete: %v", err)
	}
	if _, ok, _ := s.Get(1); ok {
		t.Fatal("a canceled Put wrote")
	}
}

// TestConcurrentWritersShareCommits runs many writers at once, a few of
// which are refused inside the shared transactions, and proves that every
// accepted write is there, no refused one is, the index matches, and
// writes were batched (fewer transactions than writes).
func TestConcurrentWritersShareCommits(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	if err := s.Put(ctx, leased(1, "ci", "taken")); err != nil {
		t.Fatal(err)
	}
	before := s.txs.Load()
	const writers, each = 32, 20
	var wg sync.WaitGroup
	errs := make([]error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for n := range each {
				i := 2 + w*each + n
				req := fmt.Sprintf("r%d", i)
				if n == each-1 {
					req = "taken" // refused: slot 1 holds it
				}
				errs[i-2] = s.Put(ctx, leased(i, "ci", req))
			}
		})
	}
	wg.Wait()
	for k, err := range errs {
		i := k + 2
		_, ok, gerr := s.Get(i)
		if gerr != nil {
			t.Fatal(gerr)
		}
		var dup *DuplicateRequestError
		switch {
		case (k%each == each-1) != errors.As(err, &dup):
			t.Fatalf("slot %d: Put returned %v", i, err)
		case (err == nil) != ok:
			t.Fatalf("slot %d: Put returned %v but record present = %v", i, err, ok)
		}
	}
	checkRequestIndex(t, s)
	txs := s.txs.Load() - before
	t.Logf("%d writes in %d transactions", writers*each, txs)
	if txs >= writers*each {
		t.Fatalf("%d writes took %d transactions: nothing was batched", writers*each, txs)
	}
}

// TestUnknownFieldsSurviveUpdate writes a record as a newer minor version
// would (an extra field), and proves that Load reads it and Update keeps
// the field, while Put (a replacement) does not.
func TestUnknownFieldsSurviveUpdate(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	r := leased(4, "ci", "q")
	v, err := encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	v = protowire.AppendTag(v, 99, protowire.BytesType)
	v = protowire.AppendString(v, "from the future")
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSlots).Put(slotKey(4), v); err != nil {
			return err
		}
		return tx.Bucket(bucketRequests).Put(requestKeyOf(&r), slotKey(4))
	}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Get(4)
	if err != nil || !ok {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	sameRecord(t, got, r)
	if _, err := s.Update(ctx, 4, func(rec *Record) error { rec.Expires = rec.Expires.Add(time.Minute); return nil }); err != nil {
		t.Fatal(err)
	}
	if !hasField99(t, s, 4) {
		t.Fatal("Update dropped the unknown field")
	}
	if err := s.Put(ctx, r); err != nil {
		t.Fatal(err)
	}
	if hasField99(t, s, 4) {
		t.Fatal("Put kept an unknown field: it is documented to replace the record")
	}
}

func hasField99(t *testing.T, s *Store, i int) bool {
	t.Helper()
	var found bool
	if err := s.read(func(tx *txn) error {
		b := tx.bucket(inSlots).Get(slotKey(i))
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if num == 99 {
				found = true
			}
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			b = b[m:]
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

func TestExpired(t *testing.T) {
	r := leased(1, "o", "")
	for _, tc := range []struct {
		rec  Record
		now  time.Time
		want bool
	}{
		{r, t0, false},
		{r, r.Expires.Add(-time.Nanosecond), false},
		{r, r.Expires, true},
		{idle(1), t0.Add(100 * 365 * 24 * time.Hour), false},
	} {
		if got := tc.rec.Expired(tc.now); got != tc.want {
			t.Errorf("Expired(%v) with expiry %v = %v, want %v", tc.now, tc.rec.Expires, got, tc.want)
		}
	}
}

func TestNewLeaseID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewLeaseID()
		if len(id) != 32 {
			t.Fatalf("lease id %q is not 32 hex digits", id)
		}
		for _, c := range id {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				t.Fatalf("lease id %q is not lowercase hex", id)
			}
		}
		if seen[id] {
			t.Fatalf("lease id %q repeated", id)
		}
		seen[id] = true
	}
}

// TestSyncFollowsTheFilesystem opens stores on tmpfs and on the disk with
// each Sync mode: SyncAuto fsyncs on the disk only, as statfs(2) tells.
func TestSyncFollowsTheFilesystem(t *testing.T) {
	fsType := func(dir string) int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Type
	}
	tmpfs, disk := "/dev/shm", "/var/tmp"
	if !inMemory(fsType(tmpfs)) || inMemory(fsType(disk)) {
		t.Skipf("need %s on tmpfs and %s on a disk", tmpfs, disk)
	}
	for _, tc := range []struct {
		parent string
		mode   Sync
		fsync  bool
	}{
		{tmpfs, SyncAuto, false},
		{disk, SyncAuto, true},
		{tmpfs, SyncAlways, true},
		{disk, SyncNever, false},
	} {
		dir, err := os.MkdirTemp(tc.parent, "leases-sync")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		s, err := Open(filepath.Join(dir, "leases.db"), Options{Sync: tc.mode})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Opened().Fsync; got != tc.fsync {
			t.Errorf("%s, mode %d: Fsync %v, want %v", tc.parent, tc.mode, got, tc.fsync)
		}
		if err := s.Put(context.Background(), leased(1, "o", "r")); err != nil {
			t.Error(err)
		}
		s.Close()
	}
	if _, err := Open(filepath.Join(t.TempDir(), "leases.db"), Options{Sync: 9}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Sync 9: %v, want ErrInvalid", err)
	}
}
