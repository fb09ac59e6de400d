package phases

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/phasegate/phasegate/internal/rootdir"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// hostCheckedName is the file in the state directory that says for which
// ranges, in which boot and network namespace, the host check last
// passed. A restart of the same configuration in the same boot leaves the
// check until after the port (issue 48, item 1): its refusal is a
// configuration error, and this configuration was judged already, while
// on a host with thousands of the daemon's own slots the check reads
// every one of their addresses and routes (~50 ms at 10,000), which the
// first answer would wait for. What the host gained since is then the
// health warning host-overlap, as when it gains it while the daemon runs.
const hostCheckedName = "host-checked"

// hostCheckedKey is what hostCheckedName holds for this configuration
// now: the boot, the network namespace, the slot CIDRs and the guest
// network. Any difference, a torn write included, runs the check before
// the port.
func (d *Daemon) hostCheckedKey() (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read the boot id: %w", err)
	}
	scope, err := lockfile.NetNSScope()
	if err != nil {
		return "", err
	}
	guest := "none"
	if d.cfg.Slots.Guest.Enabled() {
		guest = d.cfg.Slots.Guest.Range().String()
	}
	cidr6 := "none"
	if d.cfg.Slots.IPv6() {
		cidr6 = d.cfg.Slots.CIDR6.String()
	}
	return fmt.Sprintf("boot %s netns %s cidr %s cidr6 %s guest %s\n", strings.TrimSpace(string(boot)), scope, d.cfg.Slots.CIDR, cidr6, guest), nil
}

// hostCheckedBefore reports whether the host check passed for this very
// configuration earlier in this boot; any error reading it says no.
func (d *Daemon) hostCheckedBefore() bool {
	key, err := d.hostCheckedKey()
	if err != nil {
		return false
	}
	dir, err := rootdir.Open(d.cfg.StateDir)
	if err != nil {
		return false
	}
	defer dir.Close()
	f, err := dir.OpenFile(hostCheckedName, os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	buf := make([]byte, len(key)+1)
	n, _ := f.Read(buf)
	return string(buf[:n]) == key
}

// noteHostChecked records in the state directory that the host check
// passed for this configuration (passed), or removes the record (a check
// after the port found an overlap: the next start checks before it, and
// refuses). A failure only costs the next start the check before the
// port: it is logged, not returned.
func (d *Daemon) noteHostChecked(passed bool) {
	if err := d.writeHostChecked(passed); err != nil {
		d.log.Warn("the host check's record in the state directory", "error", err)
	}
}

func (d *Daemon) writeHostChecked(passed bool) error {
	dir, err := rootdir.Open(d.cfg.StateDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	if !passed {
		if err := dir.Remove(hostCheckedName); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	key, err := d.hostCheckedKey()
	if err != nil {
		return err
	}
	f, err := dir.OpenFile(hostCheckedName, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(key)
	if err := f.Close(); werr == nil && err != nil {
		werr = fmt.Errorf("close %s: %w", dir.Join(hostCheckedName), err)
	}
	return werr
}
