package slot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Attributes of ctnetlink's kernel-side dump filter (Linux 5.8+), not
// exported by the netlink library.
const (
	ctaFilter          = 25 // CTA_FILTER
	ctaFilterOrigFlags = 1  // CTA_FILTER_ORIG_FLAGS
	ctaFilterFIPSrc    = 1 << 0
	ctaFilterFIPDst    = 1 << 1
)

// flushHostConntrack deletes the root namespace's conntrack entries whose
// original source or destination is addr. The kernel filters the dump, so the
// cost does not grow with the host's conntrack table. On a kernel without
// dump filters it falls back to the library's dump-everything-and-match.
func flushHostConntrack(addr netip.Addr) error {
	var errs []error
	for _, flag := range []uint32{ctaFilterFIPSrc, ctaFilterFIPDst} {
		if err := flushFiltered(addr, flag); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return flushUnfiltered(addr)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func ctRequest(op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest((int(netlink.ConntrackTable)<<8)|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	return req
}

func flushFiltered(addr netip.Addr, flag uint32) error {
	a := addr.As4()
	attr := nl.CTA_IP_V4_SRC
	if flag == ctaFilterFIPDst {
		attr = nl.CTA_IP_V4_DST
	}
	req := ctRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	tuple := nl.NewRtAttr(nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, nil)
	ip := tuple.AddRtAttr(nl.CTA_TUPLE_IP|unix.NLA_F_NESTED, nil)
	ip.AddRtAttr(attr, a[:])
	req.AddData(tuple)
	filter := nl.NewRtAttr(ctaFilter|unix.NLA_F_NESTED, nil)
	flags := make([]byte, 4)
	binary.NativeEndian.PutUint32(flags, flag)
	filter.AddRtAttr(ctaFilterOrigFlags, flags)
	req.AddData(filter)
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("conntrack dump for %s: %w", addr, err)
	}
	var errs []error
	for _, m := range msgs {
		if len(m) < 4 {
			continue
		}
		del := ctRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		del.AddRawData(m[4:]) // the entry's attributes, after its nfgenmsg
		if _, err := del.Execute(unix.NETLINK_NETFILTER, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("conntrack delete for %s: %w", addr, err))
		}
	}
	return errors.Join(errs...)
}

func flushUnfiltered(addr netip.Addr) error {
	var filters []netlink.CustomConntrackFilter
	for _, ft := range []netlink.ConntrackFilterType{netlink.ConntrackOrigSrcIP, netlink.ConntrackOrigDstIP} {
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(ft, addr.AsSlice()); err != nil {
			return err
		}
		filters = append(filters, f)
	}
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, filters...)
	return err
}
