package nft

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables/userdata"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// byteOrderHost is nft's BYTEORDER_HOST_ENDIAN, the value nft stores under
// NFTNL_UDATA_SET_KEYBYTEORDER for a set keyed by a string type (ifname).
// Without it nft's userspace takes the key for big-endian, turns the
// padded name around before printing it, and lists every element as "".
// The kernel never reads set user data: it matters only to readers.
const byteOrderHost = 1

// setKeyReadable reports whether the set called name in table carries the
// key byte order nft needs to print its elements. It reads the set's user
// data with a GETSET request of its own: the library decodes only part of
// it. ok is false, with a nil error, for a set without it (made by an
// earlier version); a missing set is an error wrapping unix.ENOENT.
func (t *Table) setKeyReadable(name string) (ok bool, err error) {
	cfg := &mnl.Config{}
	if t.netns != "" {
		fd, err := unix.Open(t.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, fmt.Errorf("nft: open netns %s: %w", t.netns, err)
		}
		defer unix.Close(fd)
		cfg.NetNS = fd
	}
	c, err := mnl.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return false, fmt.Errorf("nft: dial netlink: %w", err)
	}
	defer c.Close()
	attrs, err := mnl.MarshalAttributes([]mnl.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(t.name + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(name + "\x00")},
	})
	if err != nil {
		return false, fmt.Errorf("nft: encode get set %s/%s: %w", t.name, name, err)
	}
	// nfgenmsg: family, version, resource id (big-endian, unused here).
	hdr := []byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}
	msgs, err := c.Execute(mnl.Message{
		Header: mnl.Header{
			Type:  mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET),
			Flags: mnl.Request | mnl.Acknowledge,
		},
		Data: append(hdr, attrs...),
	})
	if err != nil {
		var oe *mnl.OpError
		if errors.As(err, &oe) && errors.Is(oe.Err, unix.ENOENT) {
			return false, fmt.Errorf("nft: get set %s/%s: %w", t.name, name, unix.ENOENT)
		}
		return false, fmt.Errorf("nft: get set %s/%s: %w", t.name, name, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := mnl.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return false, fmt.Errorf("nft: decode set %s/%s: %w", t.name, name, err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_USERDATA {
				continue
			}
			v, found := userdata.GetUint32(ad.Bytes(), userdata.NFTNL_UDATA_SET_KEYBYTEORDER)
			if found && v == byteOrderHost {
				return true, nil
			}
		}
		if err := ad.Err(); err != nil {
			return false, fmt.Errorf("nft: decode set %s/%s: %w", t.name, name, err)
		}
	}
	return false, nil
}
