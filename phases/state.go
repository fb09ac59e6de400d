package phases

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/internal/rootdir"
	"github.com/phasegate/phasegate/network/leases"
)

// StateFileName is the durable record of the slots (network/leases), in the
// state directory.
const StateFileName = "slots.db"

// HistoryFileName is the start history (package lifecycle/history), in
// the state directory: the last starts' phases and tasks, which the views
// compare this start with.
const HistoryFileName = "starts.json"

// StatePath is the state file of this configuration.
func (c Config) StatePath() string { return filepath.Join(c.StateDir, StateFileName) }

// openedState is the durable records as openState found them.
type openedState struct {
	store *leases.Store
	// safeMode: records were lost, so slots something lives in are kept
	// (restorePlan.held); lost says why, for the health warning.
	safeMode bool
	lost     string
	// journal is the journal's loss, when that is why (leases.JournalLoss).
	journal *leases.JournalLoss
}

// openState opens the durable records of cfg after the lock is taken. A
// file that is corrupt or unreadable is moved aside for inspection and
// replaced by a fresh one, and the restore runs in safe mode: it cannot
// tell leased slots from leaked ones, so it destroys none that something
// lives in. A file of a newer schema is a configuration error (exit 2):
// starting would lose what the newer daemon recorded.
func openState(cfg Config, log *slog.Logger) (openedState, error) {
	path := cfg.StatePath()
	st, err := leases.Open(path, leases.Options{})
	var corrupt *leases.CorruptError
	var access *leases.AccessError
	var schema *leases.SchemaError
	var locked *leases.LockedError
	var link *rootdir.LinkError
	switch {
	case err == nil:
		// Records must outlive the process, not the machine: commits are
		// fsynced only where that buys a reboot's survival (leases.SyncAuto).
		o := st.Opened()
		log.Info("state file open", "path", path, "fsync", o.Fsync, "replayed", o.Replayed, "generation", o.Generation,
			"fresh", o.Fresh, "was_closed", o.WasClosed)
		if o.UpgradedFrom != 0 {
			log.Info("state file upgraded", "path", path, "from_schema", o.UpgradedFrom,
				"to_schema", leases.SchemaVersion, "backup", o.Backup)
		}
		// A journal that lost writes after they returned: the records
		// may miss leases, so no slot without a lease record that
		// something lives in is taken for leaked.
		if l := o.JournalLoss; l != nil {
			lost := "the state file's journal lost writes after they were acknowledged (" + l.Reason + ")"
			log.Error("restoring in safe mode (no slot with a process inside is destroyed): the journal lost writes that had returned",
				"journal", l.Path, "reason", l.Reason, "found_at", l.At, "named", namedLoss(l.Named))
			return openedState{store: st, safeMode: true, lost: lost, journal: l}, nil
		}
		// A fresh store is a first start with this state directory (the
		// records live on tmpfs and vanish at a reboot with the
		// namespaces), or one whose records are gone: the slots'
		// stamps tell which slots were made under records (held when
		// something lives in them) and which by something that kept none
		// (reclaimed as leaked). Records that existed and are kept aside
		// unusable put the daemon in safe mode, and it stays there
		// while the unusable file is kept aside: removing the file (once
		// inspected) ends safe mode at the next start.
		if aside := keptAside(path); aside != "" {
			lost := fmt.Sprintf("an unusable state file is kept aside at %s: safe mode until it is removed", aside)
			log.Warn("restoring in safe mode (no slot with a process inside is destroyed) while an unusable state file is kept aside; remove it to end safe mode",
				"kept_aside", aside)
			return openedState{store: st, safeMode: true, lost: lost}, nil
		}
		return openedState{store: st}, nil
	case errors.As(err, &schema):
		return openedState{}, fmt.Errorf("%w: %v", ErrConfig, err)
	case errors.As(err, &link):
		// Only root can have put it in a state directory only root
		// controls; what it points to is not the daemon's to judge.
		return openedState{}, fmt.Errorf("%w: state file: %w", ErrConfig, link)
	case errors.As(err, &locked):
		return openedState{}, fmt.Errorf("state file %s is open in another process (%s): two daemons must never share a state directory: %w", path, holder(locked.PID), err)
	case errors.As(err, &corrupt), errors.As(err, &access):
		aside, merr := leases.MoveAside(path)
		if merr != nil {
			return openedState{}, fmt.Errorf("state file %s: %w; and it could not be moved aside: %w", path, err, merr)
		}
		log.Error("state file unusable: moved aside for inspection; restoring in safe mode (no slot with a process inside is destroyed)",
			"error", err, "moved_to", aside)
		lost := fmt.Sprintf("state file unusable (%v), moved to %s", err, aside)
		if st, err = leases.Open(path, leases.Options{}); err != nil {
			return openedState{}, fmt.Errorf("state file %s after moving the unusable one aside: %w", path, err)
		}
		return openedState{store: st, safeMode: true, lost: lost}, nil
	default:
		return openedState{}, fmt.Errorf("state file %s: %w", path, err)
	}
}

// keptAside returns the newest unusable state file moved aside next to
// path (leases.MoveAside), or the journal of a state file that is gone
// (set aside by leases.Open: its records are lost as surely), or "" when
// there is none.
func keptAside(path string) string {
	k := leases.KeptAside(path)
	for _, names := range [][]string{k.Copies, k.Orphans} {
		if len(names) > 0 {
			return names[len(names)-1]
		}
	}
	return ""
}

func holder(pid int) string {
	if pid == 0 {
		return "pid unknown"
	}
	return fmt.Sprintf("pid %d", pid)
}

// namedLoss lists what a lost journal still told, for a log line.
func namedLoss(named []leases.LostChange) string {
	var b strings.Builder
	for i, n := range named {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "slot %d", n.Index)
		if n.Owner != "" {
			fmt.Fprintf(&b, " owner %s request %s", names.Shown(n.Owner), names.Shown(n.RequestID))
		}
		if n.Removed {
			b.WriteString(" (ended)")
		}
	}
	return b.String()
}
