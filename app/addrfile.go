package app

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// AddrFileEnv names the environment variable through which a process that
// started this one (a test, a supervisor's script) learns the port's
// address, whatever the log format: when it is set, listen writes the
// bound address (host:port and a newline) to the file it names, and fails
// if it cannot. The file is written whole or not at all (a temporary file
// in the same directory renamed over it), so a reader that finds it reads
// the whole address; it appears before serve, once the port is bound.
// Package phasetest/proc sets it for every process it starts.
const AddrFileEnv = "PHASEGATE_ADDR_FILE"

// reportAddr writes addr to the file AddrFileEnv names, if it names one.
func reportAddr(addr net.Addr) error {
	path := os.Getenv(AddrFileEnv)
	if path == "" {
		return nil
	}
	if err := writeAtomically(path, addr.String()+"\n"); err != nil {
		return fmt.Errorf("report the address to $%s: %w", AddrFileEnv, err)
	}
	return nil
}

// writeAtomically writes content to path through a temporary file in the
// same directory, renamed over path once closed.
func writeAtomically(path, content string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
