package leases_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
)

// The daemon's use: record a lease before replying to Acquire, answer a
// retried Acquire from the request index, keep the lease alive, and find
// it again after a restart.
func Example() {
	dir, err := os.MkdirTemp("", "leases-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "leases.db")
	ctx := context.Background()

	s, err := leases.Open(path, leases.Options{LockTimeout: time.Second})
	var corrupt *leases.CorruptError
	if errors.As(err, &corrupt) {
		// Keep the file for inspection; start with no records, and treat
		// every slot found on the host as unknown (quarantine, not reclaim).
		aside, _ := leases.MoveAside(path)
		log.Printf("lease store moved aside to %s: %v", aside, err)
		s, err = leases.Open(path, leases.Options{})
	}
	if err != nil {
		log.Fatal(err)
	}

	// Acquire(owner "ci-runner", request "job-42", TTL 30s) takes slot 7.
	now := time.Now()
	acquire := func(owner, request string) leases.Record {
		if rec, ok, err := s.ByRequest(owner, request); err != nil {
			log.Fatal(err)
		} else if ok {
			return rec // a retry: the same slot, the same lease
		}
		rec := leases.Record{
			Index: 7, State: leases.Leased,
			Owner: owner, LeaseID: leases.NewLeaseID(), RequestID: request, Principal: "uid:1000",
			Acquired: now, TTL: 30 * time.Second, Expires: now.Add(30 * time.Second),
			Netns:       netns.ID{Dev: 4, Ino: 4026532871}, // netns.Stat of the slot's file
			HostIfindex: 412,
			Created:     now.Add(-time.Minute),
		}
		if err := s.Put(ctx, rec); err != nil { // committed and fsynced
			log.Fatal(err)
		}
		return rec // only now may the reply go out
	}
	first := acquire("ci-runner", "job-42")
	retry := acquire("ci-runner", "job-42")
	fmt.Println("retry got the same lease:", retry.Index == first.Index && retry.LeaseID == first.LeaseID)

	// KeepAlive: compare the lease id, move the expiry.
	_, err = s.Update(ctx, 7, func(r *leases.Record) error {
		if r.LeaseID != first.LeaseID {
			return errors.New("not your lease")
		}
		r.Expires = time.Now().Add(r.TTL)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	s.Close()

	// A restart: the lease is there, with the slot's kernel identity.
	s, err = leases.Open(path, leases.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	recs, err := s.Load()
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		fmt.Printf("slot %d %s by %s (request %s), netns inode %d\n", r.Index, r.State, r.Owner, r.RequestID, r.Netns.Ino)
	}
	// Output:
	// retry got the same lease: true
	// slot 7 leased by ci-runner (request job-42), netns inode 4026532871
}
