package recordpb_test

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
	src, err := os.ReadFile("record.proto")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "record.proto"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	gen, err := filepath.Abs("../../../../tools/proto/generate.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gen, "record.proto")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate: %v\n%s", err, out)
	}
	want, err := os.ReadFile(filepath.Join(dir, "record.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("record.pb.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("record.pb.go is stale: run go generate ./network/leases/...")
	}
}
