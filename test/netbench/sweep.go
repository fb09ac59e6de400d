package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
)

// randomPrefix returns lead and four random lowercase letters: a slot
// prefix of the benchmark's own, clear of a daemon's and of other runs'.
func randomPrefix(lead string) string {
	b := []byte(lead)
	for range 4 {
		b = append(b, byte('a'+rand.IntN(26)))
	}
	return string(b)
}

// sweep removes everything with cfg's prefix, whatever a run left (a
// failure half-way, an interrupt): every netns file, host link and set
// element through the library's own reclaim (the benchmark lives outside
// the library and uses its exported API only), then the nftables table
// and the temporary netns directory's own bind mount.
func sweep(cfg slot.Config) error {
	ctx := context.Background()
	m, err := slot.NewManager(ctx, cfg, slot.Options{})
	if err != nil {
		return err
	}
	rep, err := reclaim.Run(ctx, m, reclaim.Options{KillOrphans: true})
	errs := []error{err}
	for _, f := range rep.Failed {
		errs = append(errs, fmt.Errorf("slot %d: %w", f.Index, f.Err))
	}
	errs = append(errs, m.Firewall().Delete(ctx))
	if strings.HasPrefix(cfg.NetnsDir, os.TempDir()) {
		// The benchmark's temporary directory (its callers remove it):
		// drop its self bind mount(s).
		for unix.Unmount(cfg.NetnsDir, unix.MNT_DETACH) == nil {
		}
	}
	return errors.Join(errs...)
}
