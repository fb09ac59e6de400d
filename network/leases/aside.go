package leases

import (
	"path/filepath"
	"slices"
	"strings"
)

// What a store sets aside beside its path, for inspection, rather than
// open or remove: an unusable file (MoveAside, with its journal if that
// held anything) and a journal found beside a fresh file, whose own file
// is gone (Open). Each name ends with the UTC time it was set aside
// (asideTime), so that names sort by age.
const (
	corruptInfix = ".corrupt-"
	orphanInfix  = ".orphan-"
	asideTime    = "20060102T150405.000000000Z"
)

// Kept lists what was set aside beside a store's path, each list oldest
// first.
type Kept struct {
	// Copies are unusable files moved aside (path.corrupt-<time>).
	Copies []string
	// CopyJournals are the journals that went with them
	// (path.corrupt-<time>.journal).
	CopyJournals []string
	// Orphans are journals found beside a fresh file
	// (path.journal.orphan-<time>): the records they held are lost as
	// surely as a copy's.
	Orphans []string
}

// KeptAside lists what Open and MoveAside set aside beside path.
func KeptAside(path string) Kept {
	var k Kept
	// The patterns are valid (only a malformed one errs), and what cannot
	// be listed is as good as not there for a caller that only reports.
	copies, _ := filepath.Glob(path + corruptInfix + "*")
	for _, c := range copies {
		if strings.HasSuffix(c, JournalSuffix) {
			k.CopyJournals = append(k.CopyJournals, c)
		} else {
			k.Copies = append(k.Copies, c)
		}
	}
	k.Orphans, _ = filepath.Glob(path + JournalSuffix + orphanInfix + "*")
	slices.Sort(k.Copies)
	slices.Sort(k.CopyJournals)
	slices.Sort(k.Orphans)
	return k
}

// All is every name in k, for a caller that lists them for removal by
// hand.
func (k Kept) All() []string {
	return slices.Concat(k.Copies, k.CopyJournals, k.Orphans)
}
