package statmode

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// typeNames are the file types stat(2) reports, by their S_IFMT bits.
var typeNames = map[uint32]string{
	unix.S_IFREG:  "regular file",
	unix.S_IFDIR:  "directory",
	unix.S_IFLNK:  "symlink",
	unix.S_IFIFO:  "FIFO",
	unix.S_IFSOCK: "socket",
	unix.S_IFCHR:  "character device",
	unix.S_IFBLK:  "block device",
}

// Type names the type of a file whose stat mode is mode ("directory",
// "socket", ...); type bits stat(2) never reports are named by their octal
// value.
func Type(mode uint32) string {
	if n, ok := typeNames[mode&unix.S_IFMT]; ok {
		return n
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}
