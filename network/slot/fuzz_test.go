package slot

import (
	"strconv"
	"testing"
)

// FuzzParseNames checks that only <prefix><i> and <prefix>h<i> with i
// written the canonical way are ever taken for ours (and only with i in
// [1, Slots] by the Parse functions): any other name, however close, is
// foreign and must never be touched.
func FuzzParseNames(f *testing.F) {
	for _, s := range []string{"pg-1", "pg-1024", "pg-1025", "pg-0", "pg-01", "pg-h7", "pg-h07", "pg-", "pg-abc", "pg-1x", "pg--1", "pg-+1", "PG-1", "pg-1 ", "pg-9999999999", "pg-2147483647", "pg-2147483648", "pg-h", "xpg-1", "pg-h1025"} {
		f.Add(s)
	}
	c := DefaultConfig()
	f.Fuzz(func(t *testing.T, name string) {
		if i, ok := c.ParseNetnsName(name); ok {
			if i < 1 || i > c.Slots || c.NetnsName(i) != name {
				t.Fatalf("ParseNetnsName(%q) = %d, but NetnsName(%d) = %q", name, i, i, c.NetnsName(i))
			}
		}
		if i, ok := c.ParseHostIfName(name); ok {
			if i < 1 || i > c.Slots || c.HostIfName(i) != name {
				t.Fatalf("ParseHostIfName(%q) = %d, but HostIfName(%d) = %q", name, i, i, c.HostIfName(i))
			}
		}
		if i, ok := c.CanonicalNetnsIndex(name); ok {
			if i < 1 || i > MaxIndex || c.NetnsName(i) != name {
				t.Fatalf("CanonicalNetnsIndex(%q) = %d, but NetnsName(%d) = %q", name, i, i, c.NetnsName(i))
			}
		}
		if i, ok := c.CanonicalHostIfIndex(name); ok {
			if i < 1 || i > MaxIndex || c.HostIfName(i) != name {
				t.Fatalf("CanonicalHostIfIndex(%q) = %d, but HostIfName(%d) = %q", name, i, i, c.HostIfName(i))
			}
		}
		// Round trip: every canonical name parses back to its index.
		if n, err := strconv.Atoi(name); err == nil && n >= 1 && n <= c.Slots {
			if i, ok := c.ParseNetnsName(c.NetnsName(n)); !ok || i != n {
				t.Fatalf("NetnsName(%d) does not parse back", n)
			}
		}
	})
}
