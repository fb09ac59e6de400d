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

// get sends one nf_tables GET request of type msg (unix.NFT_MSG_GET*) for
// attrs in the table's namespace, not a dump, and returns the answers'
// attributes. The library has no request for one set's user data nor for
// one set element: these two are made here. A missing object is an error
// wrapping unix.ENOENT.
func (t *Table) get(msg uint16, attrs []mnl.Attribute) ([][]byte, error) {
	cfg := &mnl.Config{}
	if t.netns != "" {
		fd, err := unix.Open(t.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("nft: open netns %s: %w", t.netns, err)
		}
		defer unix.Close(fd)
		cfg.NetNS = fd
	}
	c, err := mnl.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("nft: dial netlink: %w", err)
	}
	defer c.Close()
	data, err := mnl.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	// nfgenmsg: family, version, resource id (big-endian, unused here).
	hdr := []byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}
	msgs, err := c.Execute(mnl.Message{
		Header: mnl.Header{Type: mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg), Flags: mnl.Request | mnl.Acknowledge},
		Data:   append(hdr, data...),
	})
	if err != nil {
		var oe *mnl.OpError
		if errors.As(err, &oe) && errors.Is(oe.Err, unix.ENOENT) {
			return nil, unix.ENOENT
		}
		return nil, err
	}
	var out [][]byte
	for _, m := range msgs {
		if len(m.Data) >= 4 {
			out = append(out, m.Data[4:])
		}
	}
	return out, nil
}

// setKeyReadable reports whether the set called name in table carries the
// key byte order nft needs to print its elements (see byteOrderHost). ok
// is false, with a nil error, for a set without it (made by an earlier
// version); a missing set is an error wrapping unix.ENOENT.
func (t *Table) setKeyReadable(name string) (ok bool, err error) {
	answers, err := t.get(unix.NFT_MSG_GETSET, []mnl.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(t.name + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(name + "\x00")},
	})
	if err != nil {
		return false, fmt.Errorf("nft: get set %s/%s: %w", t.name, name, err)
	}
	for _, a := range answers {
		ad, err := mnl.NewAttributeDecoder(a)
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

// hasElement reports whether set holds the element keyed by key (one GET
// of that element: the set is not listed). A missing table or set holds
// nothing.
func (t *Table) hasElement(set string, key []byte) (bool, error) {
	keyAttr, err := mnl.MarshalAttributes([]mnl.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: key}})
	if err != nil {
		return false, err
	}
	elem, err := mnl.MarshalAttributes([]mnl.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: keyAttr}})
	if err != nil {
		return false, err
	}
	list, err := mnl.MarshalAttributes([]mnl.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: elem}})
	if err != nil {
		return false, err
	}
	_, err = t.get(unix.NFT_MSG_GETSETELEM, []mnl.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(t.name + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list},
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("nft: get element %q of %s/%s: %w", key, t.name, set, err)
	}
	return true, nil
}
