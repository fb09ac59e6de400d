package lockfile_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/phasegate/phasegate/phases/lockfile"
)

// The first Acquire holds the lock; a second one, here on another open
// file description of the same file as a second daemon would have, fails
// at once with wait 0 and names the holder.
func ExampleAcquire() {
	dir, err := os.MkdirTemp("", "lockfile-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "slots.lock")
	ctx := context.Background()

	l, err := lockfile.Acquire(ctx, path, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = lockfile.Acquire(ctx, path, 0)
	var held *lockfile.HeldError
	fmt.Println(errors.As(err, &held), held.PID == os.Getpid())
	heldNow, pid, _ := lockfile.Probe(ctx, path)
	fmt.Println(heldNow, pid == os.Getpid())

	if err := l.Unlock(); err != nil {
		fmt.Println(err)
	}
	heldNow, _, _ = lockfile.Probe(ctx, path)
	fmt.Println(heldNow)
	// Output:
	// true true
	// true true
	// false
}
