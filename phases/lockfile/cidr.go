package lockfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// A daemon's slot CIDR is locked with a file of its own, named after the
// network namespace it runs in and the CIDR
// (cidr-net4026531840-169.254.64.0_18.lock: addresses are exclusive per
// network namespace, and the lock directory is shared by all of them), flocked for as long as the daemon runs
// (and across an in-place upgrade, like the slots lock). CIDRs of two
// daemons can overlap without being equal, so one file per CIDR is not
// enough by itself: a daemon takes its file under a guard
// (cidrs.lock), after checking, still under the guard, that no file of
// an overlapping CIDR is held. The names are the list of CIDRs; the
// kernel's flocks say which are live, so nothing goes stale when a
// holder dies. See docs/DESIGN.md, "Exclusive addresses".

// cidrGuard is the file whose lock makes the check and the take of a CIDR
// lock one step.
const cidrGuard = "cidrs.lock"

// guardWait bounds the wait for the guard: it is held only while a daemon
// reads the lock directory.
const guardWait = 10 * time.Second

// NetNSScope names the network namespace the caller runs in, for
// [CIDRPath]: "net" and the namespace's inode, stable while it lives (a
// reused inode of a namespace gone can only meet a lock nobody holds).
func NetNSScope() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("lockfile: stat /proc/self/ns/net: %w", err)
	}
	return "net" + strconv.FormatUint(st.Ino, 10), nil
}

// CIDRPath is the lock file of cidr in lockDir, for the network namespace
// scope names (see [NetNSScope]).
func CIDRPath(lockDir, scope string, cidr netip.Prefix) string {
	return filepath.Join(lockDir, "cidr-"+scope+"-"+cidr.Addr().String()+"_"+strconv.Itoa(cidr.Bits())+".lock")
}

// parseCIDRName returns the CIDR a lock file name of scope stands for.
func parseCIDRName(name, scope string) (netip.Prefix, bool) {
	s, ok := strings.CutPrefix(name, "cidr-"+scope+"-")
	if !ok {
		return netip.Prefix{}, false
	}
	if s, ok = strings.CutSuffix(s, ".lock"); !ok {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(strings.Replace(s, "_", "/", 1))
	if err != nil || p != p.Masked() {
		return netip.Prefix{}, false
	}
	return p, true
}

// CIDRHeldError reports that another process holds a CIDR that overlaps
// the one asked for.
type CIDRHeldError struct {
	// Want is the CIDR asked for; Held the one held (equal or
	// overlapping).
	Want, Held netip.Prefix
	// Lock is the holder's lock file and pid.
	Lock *HeldError
}

func (e *CIDRHeldError) Error() string {
	how := "overlaps"
	if e.Want == e.Held {
		how = "is"
	}
	return fmt.Sprintf("slot CIDR %s %s %s, held by another phasegate (%s; lock %s)", e.Want, how, e.Held, e.Lock.Holder(), e.Lock.Path)
}

// Unwrap returns the lock's own error.
func (e *CIDRHeldError) Unwrap() error { return e.Lock }

// AcquireCIDR locks cidr in lockDir (made 0700 when missing, and refused
// unless only root controls it, as by [Acquire]) for the caller, in the
// network namespace scope names, or fails with a *[CIDRHeldError] naming a holder
// of an equal or overlapping CIDR in it. It never waits for another
// holder: two daemons whose slots would share addresses must not both
// run, whichever started first.
func AcquireCIDR(ctx context.Context, lockDir, scope string, cidr netip.Prefix) (*Lock, error) {
	if !filepath.IsAbs(lockDir) {
		return nil, fmt.Errorf("lockfile: lock directory %q is not absolute", lockDir)
	}
	if !cidr.IsValid() || cidr != cidr.Masked() {
		return nil, fmt.Errorf("lockfile: CIDR %s is not a masked prefix", cidr)
	}
	dir, err := rootdir.Ensure(lockDir, 0o700)
	if err != nil {
		return nil, fmt.Errorf("lockfile: lock directory: %w", err)
	}
	defer dir.Close()
	guard, err := acquireIn(ctx, dir, cidrGuard, guardWait)
	if err != nil {
		return nil, fmt.Errorf("lockfile: the CIDR guard: %w", err)
	}
	defer guard.Unlock()
	own := filepath.Base(CIDRPath(lockDir, scope, cidr))
	held, err := heldOverlapping(ctx, dir, scope, cidr, own, true)
	if err != nil {
		return nil, err
	}
	if held != nil {
		return nil, held
	}
	l, err := acquireIn(ctx, dir, own, 0)
	if held := (*HeldError)(nil); errors.As(err, &held) {
		return nil, &CIDRHeldError{Want: cidr, Held: cidr, Lock: held}
	}
	return l, err
}

// CIDRHolder returns a *[CIDRHeldError] naming a holder of a CIDR lock in
// lockDir that equals or overlaps cidr, in the network namespace scope
// names, or nil when none is held (or lockDir does not exist). It makes
// and takes nothing but the guard, for a moment: a daemon that finds its
// CIDR in use on the host asks it to tell another daemon's slots, named
// by that daemon's pid, from an address of the host's own.
func CIDRHolder(ctx context.Context, lockDir, scope string, cidr netip.Prefix) error {
	dir, err := rootdir.Open(lockDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lockfile: lock directory: %w", err)
	}
	defer dir.Close()
	guard, err := acquireIn(ctx, dir, cidrGuard, guardWait)
	if err != nil {
		return fmt.Errorf("lockfile: the CIDR guard: %w", err)
	}
	defer guard.Unlock()
	held, err := heldOverlapping(ctx, dir, scope, cidr, "", false)
	if err != nil {
		return err
	}
	if held != nil {
		return held
	}
	return nil
}

// heldOverlapping returns a holder of a CIDR lock in dir, but the file
// skip, whose CIDR overlaps cidr, or nil; with sweep it removes the files
// nobody holds. The caller holds the guard: every holder took its file
// under it, so what a probe finds cannot change before the guard is let
// go.
func heldOverlapping(ctx context.Context, dir *rootdir.Dir, scope string, cidr netip.Prefix, skip string, sweep bool) (*CIDRHeldError, error) {
	names, err := dir.Names()
	if err != nil {
		return nil, fmt.Errorf("lockfile: %w", err)
	}
	for _, name := range names {
		held, ok := parseCIDRName(name, scope)
		if !ok || name == skip {
			continue
		}
		locked, pid, err := probeIn(ctx, dir, name)
		if err != nil {
			return nil, err
		}
		switch {
		case locked && held.Overlaps(cidr):
			return &CIDRHeldError{Want: cidr, Held: held, Lock: &HeldError{Path: dir.Join(name), PID: pid}}, nil
		case !locked && sweep:
			// Left by a daemon that died: nobody takes a CIDR lock
			// but under the guard, so the file can go, and the
			// directory holds only the CIDRs in use.
			_ = dir.Remove(name)
		}
	}
	return nil, nil
}
