package app

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// UpgradeFilesEnv carries, across an in-place upgrade, the configuration
// files the running image read and checked at SIGHUP, to the check of the
// new binary (Config.UpgradePreflight) and to the new image: a JSON list
// of {"path", "fd", "size", "sha256"}, each descriptor a sealed memfd
// holding the file's bytes. [InheritConfigFiles] takes them.
const UpgradeFilesEnv = "PHASEGATE_UPGRADE_FILES"

// memfdSeals make a memfd's content final: no write, no resize, and no
// change of the seals themselves.
const memfdSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// ReadFunc reads the configuration file at path with every check the
// service applies to it at a start (owner, mode, links, size) and returns
// its bytes.
type ReadFunc func(path string) ([]byte, error)

// ConfigFiles is how a service reads its configuration files so that an
// in-place upgrade cannot be stopped by a file that changes during it.
// Each file is read through [ConfigFiles.ReadFile], which remembers its
// path and reader. At SIGHUP (Config.UpgradeOnHangup) the App reads each
// one again with its reader, before anything is stopped: a file that
// fails refuses the upgrade and the App keeps serving, as a binary that
// fails its check does. The bytes read are put in sealed memfds that the
// check of the new binary and the new image are handed
// ([UpgradeFilesEnv]); the new image's ReadFile returns them instead of
// reading the path again. So the new image runs on exactly what was
// checked: what the operator changed before the SIGHUP (a revoked
// principal, a renewed certificate) takes effect, and what changes during
// the drain (a file made writable by others, half written, removed) is
// read at the next SIGHUP, not by this one.
//
// A nil *ConfigFiles reads every file from its path and remembers none.
type ConfigFiles struct {
	mu      sync.Mutex
	handed  map[string]*handedFile // by path, from the previous image
	sources []configSource         // every path read, in order
	problem error                  // what could not be taken from the previous image
}

// configSource is a file a service read, and how.
type configSource struct {
	path string
	read ReadFunc
}

// handedFile is a file the previous image handed over.
type handedFile struct {
	HandedFile
	data []byte
}

// HandedFile describes a configuration file an earlier image handed over
// and [ConfigFiles.ReadFile] returned in place of reading its path.
type HandedFile struct {
	// Path is the file's path, as the service named it.
	Path string `json:"path"`
	// Size is its length in bytes, SHA256 the hex SHA-256 of its bytes:
	// what the earlier image read and checked at SIGHUP.
	Size   int    `json:"size"`
	SHA256 string `json:"sha256"`
}

// handedEntry is one file in [UpgradeFilesEnv].
type handedEntry struct {
	HandedFile
	FD int `json:"fd"`
}

// InheritConfigFiles takes the configuration files an earlier image of
// this process handed over ([UpgradeFilesEnv]), unsetting the variable and
// closing the descriptors once read. Without the variable every file is
// read from its path. It never fails: a file that cannot be taken (a
// descriptor not open, not sealed, not of the size and hash named) is read
// from its path instead, and what went wrong is logged by the App that
// Config.ConfigFiles gives it to.
func InheritConfigFiles() *ConfigFiles {
	c := &ConfigFiles{handed: map[string]*handedFile{}}
	v, ok := os.LookupEnv(UpgradeFilesEnv)
	if !ok {
		return c
	}
	os.Unsetenv(UpgradeFilesEnv)
	var entries []handedEntry
	if err := json.Unmarshal([]byte(v), &entries); err != nil {
		c.problem = fmt.Errorf("%s: %w", UpgradeFilesEnv, err)
		return c
	}
	var errs []error
	for _, e := range entries {
		if e.FD < 3 || e.Path == "" {
			errs = append(errs, fmt.Errorf("%s: %q at descriptor %d: want a path and a descriptor above 2", UpgradeFilesEnv, e.Path, e.FD))
			continue
		}
		data, err := readHanded(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.handed[e.Path] = &handedFile{HandedFile: e.HandedFile, data: data}
	}
	c.problem = errors.Join(errs...)
	return c
}

// readHanded reads and closes the sealed memfd of e, checking that its
// content is final and is what e names.
func readHanded(e handedEntry) ([]byte, error) {
	fd := e.FD
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s: %s: descriptor %d: %w", UpgradeFilesEnv, e.Path, fd, err)
	}
	f := os.NewFile(uintptr(fd), e.Path)
	defer f.Close()
	unix.CloseOnExec(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&memfdSeals != memfdSeals {
		return nil, fmt.Errorf("%s: %s: descriptor %d is not a sealed memfd (seals %#x, %v)", UpgradeFilesEnv, e.Path, fd, seals, err)
	}
	if st.Size != int64(e.Size) {
		return nil, fmt.Errorf("%s: %s: descriptor %d holds %d bytes, want %d", UpgradeFilesEnv, e.Path, fd, st.Size, e.Size)
	}
	data, err := io.ReadAll(io.NewSectionReader(f, 0, st.Size))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: descriptor %d: %w", UpgradeFilesEnv, e.Path, fd, err)
	}
	if sum := sha256Hex(data); sum != e.SHA256 {
		return nil, fmt.Errorf("%s: %s: descriptor %d: sha256 %s, want %s", UpgradeFilesEnv, e.Path, fd, sum, e.SHA256)
	}
	return data, nil
}

// ReadFile returns the content of the configuration file at path: the
// bytes the previous image handed over for path when it handed some, else
// read(path). Either way it remembers path and read, so that an upgrade
// reads the file again, through read, at its SIGHUP.
func (c *ConfigFiles) ReadFile(path string, read ReadFunc) ([]byte, error) {
	if c == nil {
		return read(path)
	}
	c.mu.Lock()
	c.sources = append(c.sources, configSource{path: path, read: read})
	h := c.handed[path]
	c.mu.Unlock()
	if h != nil {
		return h.data, nil
	}
	return read(path)
}

// Handed returns the files [ConfigFiles.ReadFile] took from the previous
// image, in the order it was asked for them.
func (c *ConfigFiles) Handed() []HandedFile {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []HandedFile
	seen := map[string]bool{}
	for _, s := range c.sources {
		if h := c.handed[s.path]; h != nil && !seen[s.path] {
			seen[s.path] = true
			out = append(out, h.HandedFile)
		}
	}
	return out
}

// logInherited says which files the previous image handed over and this
// one used, which it handed over and nobody read, and what could not be
// taken.
func (c *ConfigFiles) logInherited(log *slog.Logger) {
	if c == nil {
		return
	}
	for _, h := range c.Handed() {
		log.Info("configuration file taken from the previous image, as checked at its SIGHUP (the path was not read again)",
			"path", h.Path, "size", h.Size, "sha256", h.SHA256)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	read := map[string]bool{}
	for _, s := range c.sources {
		read[s.path] = true
	}
	for path, h := range c.handed {
		if !read[path] {
			log.Warn("configuration file handed over by the previous image, not read by this one", "path", path, "size", h.Size, "sha256", h.SHA256)
		}
	}
	if c.problem != nil {
		log.Warn("configuration files handed over by the previous image could not all be taken; those were read from their paths", "error", c.problem)
	}
}

// configSnapshot is what an upgrade read at its SIGHUP: one sealed memfd
// a file, in the order the files were first read.
type configSnapshot struct {
	files   []*os.File
	entries []HandedFile
}

// snapshot reads every file ReadFile was asked for again, each through its
// reader, into a sealed memfd. A reader's error is returned, naming the
// path, and nothing is kept.
func (c *ConfigFiles) snapshot() (*configSnapshot, error) {
	s := &configSnapshot{}
	if c == nil {
		return s, nil
	}
	c.mu.Lock()
	sources := append([]configSource(nil), c.sources...)
	c.mu.Unlock()
	seen := map[string]bool{}
	for _, src := range sources {
		if seen[src.path] {
			continue
		}
		seen[src.path] = true
		data, err := src.read(src.path)
		if err != nil {
			s.close()
			if !strings.Contains(err.Error(), src.path) { // os.ReadFile's errors name it
				err = fmt.Errorf("%s: %w", src.path, err)
			}
			return nil, err
		}
		f, err := sealedMemfd(filepath.Base(src.path), data)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("%s: %w", src.path, err)
		}
		s.files = append(s.files, f)
		s.entries = append(s.entries, HandedFile{Path: src.path, Size: len(data), SHA256: sha256Hex(data)})
	}
	return s, nil
}

// sealedMemfd returns a memfd holding data, sealed so that nobody, this
// process included, can change it any more. It is close-on-exec until an
// upgrade hands it over.
func sealedMemfd(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("phasegate-config:"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write memfd: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, memfdSeals); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seal memfd: %w", err)
	}
	return f, nil
}

// env returns the value of [UpgradeFilesEnv] for a process in which the
// i-th file is at descriptor fd(i).
func (s *configSnapshot) env(fd func(i int) int) string {
	entries := make([]handedEntry, len(s.entries))
	for i, e := range s.entries {
		entries[i] = handedEntry{HandedFile: e, FD: fd(i)}
	}
	b, _ := json.Marshal(entries) // strings and numbers only
	return string(b)
}

// close closes the memfds; idempotent, and nil-safe.
func (s *configSnapshot) close() {
	if s == nil {
		return
	}
	for _, f := range s.files {
		_ = f.Close()
	}
	s.files = nil
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
