package rootdir_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// A directory is made (or found) and checked by the descriptor opened;
// a link planted in it is refused, not followed.
func Example() {
	base, err := os.MkdirTemp("", "rootdir-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(base)
	d, err := rootdir.Ensure(filepath.Join(base, "state"), 0o700)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	if err := os.Symlink("/etc/passwd", d.Join("slots.db")); err != nil {
		fmt.Println(err)
		return
	}
	_, err = d.OpenFile("slots.db", os.O_RDWR|os.O_CREATE, 0o600)
	var link *rootdir.LinkError
	fmt.Println(errors.As(err, &link), filepath.Base(link.Path))
	// Output:
	// true slots.db
}
