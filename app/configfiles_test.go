package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// configFilesHelperEnv makes this test binary a process of the handover's
// tests instead of running tests:
//
//   - "report|PATH|SHA256": take the files handed over, read PATH through
//     them with a reader that always fails (so that only a handed-over
//     copy can be returned), print a [helperReport] and exit 0 when the
//     bytes returned have that hash, 1 otherwise;
//   - "exec|ACTION|PATH|BIN": read PATH through a ConfigFiles, take the
//     upgrade's snapshot, then ACTION the file ("garble": write another
//     policy over it and make it 0666; "remove"), and exec BIN as an
//     upgrade does, as "report|PATH|<the snapshot's hash>".
const configFilesHelperEnv = "PHASEGATE_TEST_CONFIGFILES"

// helperReport is what a "report" helper prints.
type helperReport struct {
	Data    string       `json:"data"`
	Err     string       `json:"err,omitempty"`
	Handed  []HandedFile `json:"handed"`
	Problem string       `json:"problem,omitempty"`
	EnvLeft bool         `json:"env_left"` // UpgradeFilesEnv still set
}

func init() {
	if v, ok := os.LookupEnv(configFilesHelperEnv); ok {
		os.Exit(configFilesHelper(strings.Split(v, "|")))
	}
}

func configFilesHelper(args []string) int {
	switch {
	case len(args) == 3 && args[0] == "report":
		files := InheritConfigFiles()
		data, err := files.ReadFile(args[1], func(string) ([]byte, error) {
			return nil, errors.New("read from the path, not handed over")
		})
		r := helperReport{Data: string(data), Handed: files.Handed()}
		_, r.EnvLeft = os.LookupEnv(UpgradeFilesEnv)
		if err != nil {
			r.Err = err.Error()
		}
		if files.problem != nil {
			r.Problem = files.problem.Error()
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		if err != nil || sha256Hex(data) != args[2] {
			return 1
		}
		return 0
	case len(args) == 4 && args[0] == "exec":
		path, bin := args[2], args[3]
		files := InheritConfigFiles()
		if _, err := files.ReadFile(path, os.ReadFile); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		snap, err := files.snapshot()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if err := changeAfterSnapshot(args[1], path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		f, err := os.Open(bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		os.Setenv(configFilesHelperEnv, "report|"+path+"|"+snap.entries[0].SHA256)
		a := &App{log: slog.New(slog.NewTextHandler(os.Stderr, nil)), execPath: bin, upgradeIn: &upgradeInputs{bin: f, files: snap}}
		fmt.Fprintln(os.Stderr, a.execUpgrade())
		return 2
	}
	fmt.Fprintf(os.Stderr, "%s=%q: unknown\n", configFilesHelperEnv, strings.Join(args, "|"))
	return 2
}

// changeAfterSnapshot does to the file at path what an editor or a
// config tool may do during an upgrade's drain.
func changeAfterSnapshot(action, path string) error {
	switch action {
	case "garble":
		if err := os.WriteFile(path, []byte(`{"principals": [{"uid": 65534, "ow`), 0o600); err != nil {
			return err
		}
		return os.Chmod(path, 0o666)
	case "remove":
		return os.Remove(path)
	}
	return fmt.Errorf("unknown action %q", action)
}

// checkedRead is a reader with a service's checks: a regular file that
// only its owner may write.
func checkedRead(path string) ([]byte, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("mode %v: refused", st.Mode())
	}
	return os.ReadFile(path)
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The snapshot reads each file again, through its reader, when it is
// taken: it holds what the file says then, not what it said at the
// start; the copy is sealed, even against this process.
func TestConfigFilesSnapshotRereadsAndSeals(t *testing.T) {
	path := writeConfig(t, "v1")
	files := InheritConfigFiles()
	if b, err := files.ReadFile(path, checkedRead); err != nil || string(b) != "v1" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if len(files.Handed()) != 0 {
		t.Fatalf("handed %v without a previous image", files.Handed())
	}
	if err := os.WriteFile(path, []byte("v2, what the operator changed before SIGHUP"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := files.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.close()
	if len(snap.files) != 1 || snap.entries[0].Path != path || snap.entries[0].SHA256 != sha256Hex([]byte("v2, what the operator changed before SIGHUP")) {
		t.Fatalf("snapshot %+v", snap.entries)
	}
	got, err := io.ReadAll(io.NewSectionReader(snap.files[0], 0, 1<<20))
	if err != nil || string(got) != "v2, what the operator changed before SIGHUP" {
		t.Fatalf("the memfd holds %q, %v", got, err)
	}
	if _, err := snap.files[0].WriteAt([]byte("x"), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("writing the sealed copy: %v, want EPERM", err)
	}
	if err := snap.files[0].Truncate(0); !errors.Is(err, unix.EPERM) {
		t.Errorf("truncating the sealed copy: %v, want EPERM", err)
	}
}

// A file that fails its reader's checks at SIGHUP (made 0666, removed)
// fails the snapshot, naming it: the upgrade is refused.
func TestConfigFilesSnapshotRefusesAFileThatFailsItsChecks(t *testing.T) {
	for _, action := range []string{"garble", "remove"} {
		t.Run(action, func(t *testing.T) {
			path := writeConfig(t, "v1")
			files := InheritConfigFiles()
			if _, err := files.ReadFile(path, checkedRead); err != nil {
				t.Fatal(err)
			}
			if err := changeAfterSnapshot(action, path); err != nil {
				t.Fatal(err)
			}
			snap, err := files.snapshot()
			if err == nil {
				snap.close()
				t.Fatal("snapshot of a file that fails its checks succeeded")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %s", err, path)
			}
		})
	}
}

// The check of the new binary is handed the snapshot: it reads the bytes
// taken at SIGHUP even though the file was garbled after, and without the
// snapshot the same check fails (it reads the path).
func TestConfigFilesHandedToThePreflight(t *testing.T) {
	path := writeConfig(t, `{"principals": []}`)
	files := InheritConfigFiles()
	if _, err := files.ReadFile(path, checkedRead); err != nil {
		t.Fatal(err)
	}
	snap, err := files.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.close()
	if err := changeAfterSnapshot("garble", path); err != nil {
		t.Fatal(err)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(configFilesHelperEnv, "report|"+path+"|"+sha256Hex([]byte(`{"principals": []}`)))
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := &App{cfg: Config{UpgradePreflight: []string{"-test.run=^$"}}, execPath: bin}
	if err := a.preflight(context.Background(), &upgradeInputs{bin: f, files: snap}); err != nil {
		t.Fatalf("preflight with the snapshot: %v", err)
	}
	if err := a.preflight(context.Background(), &upgradeInputs{bin: f, files: &configSnapshot{}}); err == nil || !strings.Contains(err.Error(), "read from the path") {
		t.Fatalf("preflight without the snapshot = %v, want the path read", err)
	}
}

// The new image of an upgrade takes the bytes read at SIGHUP, whatever
// became of the file during the drain (garbled and made 0666, removed),
// and so does the image that was running when the exec of the new binary
// fails (/proc/self/exe). It unsets the variable and names what it took.
func TestConfigFilesHandedAcrossTheExec(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	notExecutable := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExecutable, []byte("\x7fELF garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, action, bin string }{
		{"garbled", "garble", self},
		{"removed", "remove", self},
		{"exec failed", "garble", notExecutable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const body = `{"principals": [{"uid": 65534, "owners": ["kept-*"]}]}`
			path := writeConfig(t, body)
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), configFilesHelperEnv+"=exec|"+tc.action+"|"+path+"|"+tc.bin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v: %s%s", err, stdout.String(), stderr.String())
			}
			var r helperReport
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
				t.Fatalf("report %q: %v", stdout.String(), err)
			}
			want := HandedFile{Path: path, Size: len(body), SHA256: sha256Hex([]byte(body))}
			if r.Data != body || len(r.Handed) != 1 || r.Handed[0] != want || r.Problem != "" || r.EnvLeft {
				t.Fatalf("the new image read %+v, want %q handed over as %+v", r, body, want)
			}
			if tc.bin != self && !strings.Contains(stderr.String(), "restarting the running one") {
				t.Errorf("no fallback to the running image logged:\n%s", stderr.String())
			}
		})
	}
}

// A descriptor that is not a sealed memfd of the size and hash named is
// not taken: the file is read from its path, and the problem kept for the
// log.
func TestInheritConfigFilesRefusesWhatIsNotTheSnapshot(t *testing.T) {
	path := writeConfig(t, "on disk")
	// memfd returns a new memfd holding data, sealed or not; taking it
	// closes it.
	memfd := func(data string, seal bool) int {
		t.Helper()
		fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Write(fd, []byte(data)); err != nil {
			t.Fatal(err)
		}
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, memfdSeals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	for _, tc := range []struct {
		name       string
		data       string
		seal       bool
		size       int
		sum, want  string
		noneOpened bool
	}{
		{name: "unsealed", data: "forged", size: 6, sum: sha256Hex([]byte("forged")), want: "not a sealed memfd"},
		{name: "other hash", data: "sealed", seal: true, size: 6, sum: sha256Hex([]byte("sealex")), want: "sha256"},
		{name: "other size", data: "sealed", seal: true, size: 5, sum: sha256Hex([]byte("sealed")), want: "holds 6 bytes, want 5"},
		{name: "not open", size: 6, sum: sha256Hex([]byte("sealed")), want: "descriptor 1048576", noneOpened: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := 1 << 20
			if !tc.noneOpened {
				fd = memfd(tc.data, tc.seal)
			}
			b, _ := json.Marshal([]handedEntry{{HandedFile{path, tc.size, tc.sum}, fd}})
			t.Setenv(UpgradeFilesEnv, string(b))
			files := InheritConfigFiles()
			if _, ok := os.LookupEnv(UpgradeFilesEnv); ok {
				t.Error("the variable is still set")
			}
			if !tc.noneOpened {
				if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
					t.Errorf("descriptor %d left open (%v)", fd, err)
				}
			}
			got, err := files.ReadFile(path, checkedRead)
			if err != nil || string(got) != "on disk" {
				t.Fatalf("ReadFile = %q, %v; want the file on disk", got, err)
			}
			if files.problem == nil || !strings.Contains(files.problem.Error(), tc.want) {
				t.Fatalf("problem %v, want %q", files.problem, tc.want)
			}
			if len(files.Handed()) != 0 {
				t.Errorf("handed %v", files.Handed())
			}
		})
	}
}

// A nil ConfigFiles reads from the path and snapshots nothing.
func TestConfigFilesNil(t *testing.T) {
	var files *ConfigFiles
	path := writeConfig(t, "v1")
	if b, err := files.ReadFile(path, checkedRead); err != nil || string(b) != "v1" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	snap, err := files.snapshot()
	if err != nil || len(snap.files) != 0 || files.Handed() != nil {
		t.Fatalf("snapshot %+v, %v", snap, err)
	}
}
