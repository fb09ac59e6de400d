package leases

import (
	"errors"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases/internal/recordpb"
)

// A record is data: a stored egress policy that a client's would be
// refused for (here, one no daemon wrote) makes its record unreadable,
// named in a RecordsError, never a lease whose rules cannot be written.
func TestStoredEgressPolicyIsChecked(t *testing.T) {
	s := openTemp(t)
	r := policied(4)
	var m recordpb.Record
	fill(&m, &r)
	m.EgressPolicy.Allow = []string{"10.0.0.0/8", "10.9.0.0/16"}
	v, err := marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return putRaw(tx, r, v) }); err != nil {
		t.Fatal(err)
	}
	recs, err := s.Load()
	var re *RecordsError
	if !errors.As(err, &re) || re.Bad[4] == nil || len(recs) != 0 {
		t.Fatalf("Load = %+v, %v; want slot 4 named bad", recs, err)
	}
	if !errors.Is(re.Bad[4], egress.ErrInvalid) || !errors.Is(re.Bad[4], ErrInvalid) {
		t.Errorf("slot 4: %v, want an invalid record for its invalid egress policy", re.Bad[4])
	}
}
