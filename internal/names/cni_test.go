package names

import (
	"errors"
	"strings"
	"testing"
)

// An interface name is a name, and one the kernel makes as it is given:
// each refusal names the field and the rule it breaks, in printable
// ASCII.
func TestCheckIfName(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" for a name the rule takes
	}{
		{"eth0", ""},
		{"net1.100", ""},
		{strings.Repeat("x", 15), ""},
		{"", "CNI_IFNAME is empty"},
		{"eth\x00x", `"eth\x00x": U+0000, a control character, at byte 3`},
		{"eth 0", "U+0020, a space"},
		{"eth0\u3164", "U+3164, outside ASCII"},
		{strings.Repeat("x", 16), "16 bytes: " + IfNameRule},
		{".", "a directory's name"},
		{"..", "a directory's name"},
		{"a/b", `'/' at byte 1`},
		{"eth0:1", `':' at byte 4`},
		{"eth%d", `'%' at byte 3`},
	} {
		err := CheckIfName("CNI_IFNAME", tc.in)
		if tc.want == "" {
			if err != nil {
				t.Errorf("CheckIfName(%q) = %v, want nil", tc.in, err)
			}
			continue
		}
		var ne *Error
		var re *RuleError
		if err == nil || !errors.As(err, &ne) && !errors.As(err, &re) {
			t.Errorf("CheckIfName(%q) = %#v, want an *Error or a *RuleError", tc.in, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.HasPrefix(msg, "CNI_IFNAME") || !printableASCII(msg) {
			t.Errorf("CheckIfName(%q) = %q, want it to name the field and say %q, in printable ASCII", tc.in, msg, tc.want)
		}
	}
}

// The CNI spec's names: letters, digits, '_', '.' and '-', starting with a
// letter or digit.
func TestCheckCNIName(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"pgnet", ""},
		{"0123abcd_e.f-g", ""},
		{"", "is empty"},
		{"-x", `'-' at byte 0: ` + CNINameRule},
		{".x", `'.' at byte 0`},
		{"a/b", `'/' at byte 1`},
		{"a:b", `':' at byte 1`},
		{"a\x00b", "U+0000, a control character"},
		{"rtnet\u0430", "U+0430, outside ASCII"},
		{strings.Repeat("x", MaxLen+1), "257 bytes"},
	} {
		err := CheckCNIName("network name", tc.in)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckCNIName(%q) = %v, want nil", tc.in, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !printableASCII(err.Error())):
			t.Errorf("CheckCNIName(%q) = %v, want it to say %q", tc.in, err, tc.want)
		}
	}
}

// The kernel's rule alone: what a name recorded before CheckIfName's rule
// is held to.
func TestCheckKernelIfName(t *testing.T) {
	for in, ok := range map[string]bool{
		"eth0": true, "eth0\u3164": true, "eth%d": true, strings.Repeat("x", 15): true,
		"": false, ".": false, "..": false, strings.Repeat("x", 16): false,
		"a/b": false, "a:b": false, "a b": false, "a\tb": false, "eth\x00x": false,
	} {
		if err := CheckKernelIfName("ifname", in); (err == nil) != ok {
			t.Errorf("CheckKernelIfName(%q) = %v, want ok %v", in, err, ok)
		} else if err != nil && !printableASCII(err.Error()) {
			t.Errorf("CheckKernelIfName(%q) = %q: not printable ASCII", in, err)
		}
	}
}
