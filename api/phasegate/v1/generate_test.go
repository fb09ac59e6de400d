package phasegatev1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates the code with the pinned plugins
// into a scratch directory and compares it with what is committed.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatal("protoc not found: apt-get install protobuf-compiler")
		}
		t.Skip("protoc not found: apt-get install protobuf-compiler")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("slots.proto")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "slots.proto"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	gen, err := filepath.Abs("../../../tools/proto/generate.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gen, "slots.proto")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate: %v\n%s", err, out)
	}
	for _, f := range []string{"slots.pb.go", "slots_grpc.pb.go"} {
		want, _ := os.ReadFile(filepath.Join(dir, f))
		got, _ := os.ReadFile(f)
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./api/...", f)
		}
	}
}
