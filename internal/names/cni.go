package names

import (
	"fmt"
	"strings"
)

// MaxIfName bounds an interface name, in bytes: the kernel's IFNAMSIZ (16)
// less its terminating NUL.
const MaxIfName = 15

// The rules a CNI attachment's key adds to the names rule, in the words
// their refusals end with.
const (
	IfNameRule  = `interface names are names the kernel takes as they are: at most 15 bytes, not "." or "..", no '/', ':' or '%'`
	CNINameRule = `the CNI spec's names are letters, digits, '_', '.' and '-', starting with a letter or digit`
)

// CheckIfName returns nil if name is one the kernel takes for a link as
// it is ([CheckKernelIfName]), is a name by [Check], and holds no '%',
// which the kernel reads as a template for a number it picks ("eth%d"
// makes "eth0"): the link would not get the name recorded. Else it returns
// an error for field what, an [*Error] or a [*RuleError]. A NUL, which the
// kernel reads as the name's end, is refused by [Check]: the name
// recorded is always the link's whole name. It is the rule for a new
// attachment's interface name.
func CheckIfName(what, name string) error {
	if err := Check(what, name); err != nil {
		return err
	}
	if err := CheckKernelIfName(what, name); err != nil {
		return err
	}
	if i := strings.IndexByte(name, '%'); i >= 0 {
		return &RuleError{What: what, Name: name, Why: fmt.Sprintf("'%%' at byte %d", i), Rule: IfNameRule}
	}
	return nil
}

// CheckKernelIfName returns nil if the kernel takes name for a link
// (dev_valid_name): not "", "." or "..", at most [MaxIfName] bytes, no '/',
// ':', white space or NUL; else a [*RuleError] for field what. It is the
// kernel's rule alone, for a name recorded before [CheckIfName]'s.
func CheckKernelIfName(what, name string) error {
	switch {
	case name == "":
		return &RuleError{What: what, Name: name, Why: "empty", Rule: IfNameRule}
	case len(name) > MaxIfName:
		return &RuleError{What: what, Name: name, Why: fmt.Sprintf("%d bytes", len(name)), Rule: IfNameRule}
	case name == "." || name == "..":
		return &RuleError{What: what, Name: name, Why: "a directory's name", Rule: IfNameRule}
	}
	if i := strings.IndexAny(name, "/: \t\n\v\f\r\x00"); i >= 0 {
		return &RuleError{What: what, Name: name, Why: fmt.Sprintf("%q at byte %d", name[i], i), Rule: IfNameRule}
	}
	return nil
}

// CheckCNIName returns nil if name is a network name or a container id
// the CNI spec allows, and is a name by [Check]; else an error for field
// what, an [*Error] or a [*RuleError].
func CheckCNIName(what, name string) error {
	if err := Check(what, name); err != nil {
		return err
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return &RuleError{What: what, Name: name, Why: fmt.Sprintf("%q at byte %d", c, i), Rule: CNINameRule}
		}
	}
	return nil
}

// RuleError is a name that follows the names rule but not the narrower
// rule of the field it was given for.
type RuleError struct {
	// What names the field: "CNI_IFNAME".
	What string
	// Name is the name as given. Print it with [Shown], never raw.
	Name string
	// Why says what breaks the rule, and where.
	Why string
	// Rule is the rule broken.
	Rule string
}

// Error says which field broke which rule, and how, in one line of
// printable ASCII.
func (e *RuleError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.What, quoted(e.Name, 64), e.Why, e.Rule)
}
