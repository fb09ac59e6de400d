package netns_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/phasegate/phasegate/network/netns"
)

// Inspect tells a namespace we may delete from anything that only looks
// like one: a file with content, a symlink, a directory, a foreign mount
// are never touched.
func ExampleInspect() {
	dir, err := os.MkdirTemp("", "netns-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	_ = os.WriteFile(filepath.Join(dir, "pg-1"), nil, 0)                       // a placeholder, as Create leaves one mid-way
	_ = os.WriteFile(filepath.Join(dir, "pg-2"), []byte("not a netns"), 0o600) // someone else's file
	_ = os.Symlink("/proc/self/ns/net", filepath.Join(dir, "pg-3"))            // a look-alike

	for _, name := range []string{"pg-0", "pg-1", "pg-2", "pg-3"} {
		st, err := netns.Inspect(filepath.Join(dir, name))
		fmt.Println(name, st, errors.Is(err, netns.ErrNotNamespace))
	}
	// Output:
	// pg-0 missing false
	// pg-1 placeholder false
	// pg-2 missing true
	// pg-3 missing true
}

func ExampleValidateName() {
	for _, name := range []string{"pg-1", "", "..", "a/b"} {
		fmt.Printf("%q: %v\n", name, netns.ValidateName(name))
	}
	// Output:
	// "pg-1": <nil>
	// "": invalid netns name: empty
	// "..": invalid netns name: ".."
	// "a/b": invalid netns name: "a/b" contains '/' or NUL
}

// Create and Delete a named namespace the way iproute2 does, visible to
// `ip netns list` when dir is /run/netns. It needs root (CAP_SYS_ADMIN), so
// it is compiled but not run by go test.
func Example() {
	ctx := context.Background()
	dir := "/run/netns"
	path, err := netns.Create(ctx, dir, "pg-1")
	if err != nil {
		log.Fatal(err)
	}
	id, err := netns.Stat(path) // compare with /proc/<pid>/ns/net
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(path, id.Ino)

	// Idempotent: a second Delete, or one of a name that is gone, is nil.
	// A namespace a process still holds survives the unlink (its file
	// goes, the kernel object stays): BusyError says so after retries.
	if err := netns.Delete(ctx, dir, "pg-1"); err != nil {
		var busy *netns.BusyError
		if errors.As(err, &busy) {
			log.Print("still held: ", busy)
		}
		log.Fatal(err)
	}
}
