package cniv1_test

import (
	"errors"
	"strings"
	"testing"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// Every door's one check of a key: the spec's code for the field, and a
// message naming it.
func TestKeyCheck(t *testing.T) {
	ok := cniv1.Key{Network: "pgnet", ContainerID: "0123abcd", IfName: "eth0"}
	with := func(f func(*cniv1.Key)) cniv1.Key { k := ok; f(&k); return k }
	for _, tc := range []struct {
		name string
		key  cniv1.Key
		code uint
		want string
	}{
		{"a key", ok, 0, ""},
		{"NUL in the interface name", with(func(k *cniv1.Key) { k.IfName = "eth\x00x" }), cniv1.CodeInvalidEnvironment, `CNI_IFNAME "eth\x00x": U+0000`},
		{"an alias", with(func(k *cniv1.Key) { k.IfName = "eth0:1" }), cniv1.CodeInvalidEnvironment, `':' at byte 4`},
		{"a template", with(func(k *cniv1.Key) { k.IfName = "eth%d" }), cniv1.CodeInvalidEnvironment, `'%' at byte 3`},
		{"16 bytes", with(func(k *cniv1.Key) { k.IfName = "abcdefghijklmnop" }), cniv1.CodeInvalidEnvironment, "16 bytes"},
		{"dot-dot", with(func(k *cniv1.Key) { k.IfName = ".." }), cniv1.CodeInvalidEnvironment, "a directory's name"},
		{"NUL in the container id", with(func(k *cniv1.Key) { k.ContainerID = "a\x00b" }), cniv1.CodeInvalidEnvironment, `CNI_CONTAINERID "a\x00b"`},
		{"a slash in the container id", with(func(k *cniv1.Key) { k.ContainerID = "../x" }), cniv1.CodeInvalidEnvironment, "CNI_CONTAINERID"},
		{"NUL in the network", with(func(k *cniv1.Key) { k.Network = "pg\x00net" }), cniv1.CodeInvalidConfig, `network name "pg\x00net"`},
		{"a long network", with(func(k *cniv1.Key) { k.Network = strings.Repeat("n", 253) }), cniv1.CodeInvalidConfig, "at most 252"},
		{"a long container id", with(func(k *cniv1.Key) { k.ContainerID = strings.Repeat("c", 252) }), cniv1.CodeInvalidEnvironment, "at most 255"},
	} {
		err := tc.key.Check()
		var ke *cniv1.KeyError
		switch {
		case tc.code == 0 && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.code != 0 && (!errors.As(err, &ke) || ke.Code != tc.code || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %#v, want code %d saying %q", tc.name, err, tc.code, tc.want)
		}
	}
}
