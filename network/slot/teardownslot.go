package slot

import (
	"context"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/shape"
)

// outcome is what happened to one slot of a teardown.
type outcome struct {
	i       int
	r       Resources // what the slot has, as far as Teardown acts on it
	link    hostLink  // the host link, if it existed when the slot started
	err     error
	orphans []Orphan
	holders []Holder
	cutOff  bool
	wait    bool // host link should vanish with the namespace
	started bool
}

// unlinkOne does the per-slot part of a teardown: find its host link, deal
// with the processes inside or holding its namespace, detach and unlink its
// netns file, and cut its host link off when nothing will make the kernel
// drop it.
func (m *Manager) unlinkOne(ctx context.Context, i int, r Resources, probe *linkProbe,
	procs, holders netns.Processes, self int, kill bool) outcome {
	o := outcome{i: i, started: true}
	if !m.cfg.HostIfFits(i) {
		r &^= HasHostLink | HasElement // no such link can exist
	}
	o.r = r
	s := m.cfg.Slot(i)
	held := false
	if r&HasShaper != 0 {
		// Found by a survey: an ifb outlives the slot's links.
		if err := shape.DeleteIfb(m.cfg.ShaperIfName(i)); err != nil {
			o.err = err
			return o
		}
	}
	if r&HasHostLink != 0 {
		idx, err := probe.indexNoLoad(s.HostIf)
		if err != nil {
			o.err = err
			return o
		}
		if idx != 0 {
			o.link = hostLink{index: idx, name: s.HostIf}
		}
	}
	// A parked end, looked for before the namespace goes (it goes with
	// it): the host link pairs with an attachment's end in a namespace not
	// the slot's, which the kernel never removes with the slot's
	// (Manager.Attach, Manager.Unplug).
	attached := false
	if o.link.index != 0 {
		idx, err := probe.indexNoLoad(m.cfg.ParkedIfName(i))
		if err != nil {
			o.err = err
			return o
		}
		attached = idx != 0
	}
	if r&HasNetns != 0 {
		// The identity only to match the /proc scans: Delete checks the
		// file is a network namespace before it touches it.
		if id, err := netns.PathID(s.NetnsPath); err == nil {
			o.orphans, o.holders, held = processesOf(i, id, procs, holders, self, kill)
		}
		if err := netns.Delete(ctx, m.cfg.NetnsDir, s.NetnsName); err != nil {
			o.err = err
			return o
		}
	}
	if o.link.index == 0 {
		return o
	}
	if r&HasNetns == 0 || held || attached {
		// Nothing will make the kernel drop this link: cut it off.
		if err := deleteLink(probe, o.link.index, o.link.name); err != nil {
			o.err = err
			return o
		}
		o.cutOff = true
		return o
	}
	o.wait = true
	return o
}

// processesOf names the processes the scans found inside, or holding a
// descriptor on, slot i's namespace id, and with kill sends SIGKILL to
// those inside. held reports whether any of them may keep the namespace
// alive after its file is gone: a holder, or an orphan not killed.
func processesOf(i int, id netns.ID, procs, holders netns.Processes, self int, kill bool) (orphans []Orphan, hs []Holder, held bool) {
	for _, pid := range procs[id] {
		if pid == self {
			// A thread of ours that created the namespace and is still
			// exiting; never signal ourselves.
			continue
		}
		or := Orphan{Index: i, PID: pid, Comm: netns.Comm(pid)}
		if kill {
			or.Killed, or.Err = netns.KillIn(pid, id)
			or.Gone = !or.Killed && or.Err == nil
		}
		if !or.Killed && !or.Gone {
			held = true
		}
		orphans = append(orphans, or)
	}
	for _, pid := range holders[id] {
		if pid == self {
			continue // a descriptor of ours, open for a moment
		}
		held = true
		hs = append(hs, Holder{Index: i, PID: pid, Comm: netns.Comm(pid)})
	}
	return orphans, hs, held
}
