package cniapi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/server"
)

// target returns the namespace an ADD or a CHECK of principal p acts on,
// open, and the name the slot's end takes there. The daemon attaches only
// where its caller could enter itself (docs/SECURITY.md, "CNI"):
//
//   - The namespace is the descriptor the caller passed with its request:
//     phasegate-cni opens CNI_NETNS with the caller's own credentials, in
//     the caller's own mount namespace, and passes it (SCM_RIGHTS). The
//     daemon opens no path for a caller but root, so it never says of a
//     path what the caller could not see itself. Root, which sees every
//     path, may still name one (a runtime with a plugin from before, curl):
//     the daemon opens it.
//   - A caller other than root must be able to setns(2) into it: hold
//     CAP_SYS_ADMIN in the user namespace that owns it, by the kernel's
//     rule (netns.MayEnter), with its credentials read from its process
//     (callerCreds). The check is on the descriptor the move uses: a path
//     swapped meanwhile changes nothing.
//
// Every refusal of a caller other than root is one answer (refuseNetns):
// it does not tell a missing file from a forbidden one, nor a file from a
// namespace. Why it was refused is on the call's audit line.
func target(ctx context.Context, p control.Principal, path, ifname string) (*attachTarget, error) {
	if path == "" || !strings.HasPrefix(path, "/") || len(path) > leases.MaxAttachmentPath {
		return nil, cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("CNI_NETNS %q: want the absolute path of the container's network namespace", path))
	}
	fd := server.TakePassedFD(ctx)
	control.Note(ctx, "netns_passed", fd >= 0)
	if fd < 0 {
		if !p.IsRoot() {
			return nil, refuseNetns(ctx, p, "no namespace passed: the daemon opens a path only for root")
		}
		return openTarget(path, ifname)
	}
	id, err := netns.CheckPassed(fd)
	if err != nil {
		unix.Close(fd)
		if !p.IsRoot() {
			return nil, refuseNetns(ctx, p, err.Error())
		}
		return nil, cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("CNI_NETNS %s: %v", path, err))
	}
	to := &attachTarget{fd: fd, id: id, path: path, ifname: ifname}
	if p.IsRoot() {
		return to, nil
	}
	if why := mayEnter(ctx, p, fd); why != "" {
		to.close()
		return nil, refuseNetns(ctx, p, why)
	}
	return to, nil
}

// mayEnter says why principal p could not enter the namespace open as fd,
// or "" if it could. Its credentials are its process's (callerCreds).
func mayEnter(ctx context.Context, p control.Principal, fd int) string {
	creds, err := callerCreds(ctx, p)
	if err != nil {
		return err.Error()
	}
	ok, err := netns.MayEnter(fd, creds)
	switch {
	case err != nil:
		return err.Error()
	case !ok:
		return fmt.Sprintf("no CAP_SYS_ADMIN over the namespace's owner (euid %d, user namespace %d, CAP_SYS_ADMIN %v)", creds.EUID, creds.UserNS.Ino, creds.SysAdmin)
	}
	return ""
}

// callerCreds reads what the kernel's rule needs of principal p's
// process: the process that connected, pinned by SO_PEERPIDFD, so that a
// pid reused since is never read as p's. The kernel keeps only p's uid,
// gid and pid from connect time (SO_PEERCRED): its capabilities and user
// namespace are read as they are now, and refused if its effective uid is
// no longer the one it connected with (it exec'd a set-user-ID program
// after sending, say, which would lend the request that program's
// privileges).
func callerCreds(ctx context.Context, p control.Principal) (netns.Creds, error) {
	if p.Kind != control.Unix {
		return netns.Creds{}, errors.New("not a process on this host")
	}
	pidfd, err := server.PeerPidfd(ctx)
	if err != nil {
		return netns.Creds{}, err
	}
	defer unix.Close(pidfd)
	c, err := netns.ReadCreds(pidfd, int(p.PID))
	if err != nil {
		return netns.Creds{}, err
	}
	if c.EUID != p.UID {
		return netns.Creds{}, fmt.Errorf("the process's effective uid is %d, not %d, with which it connected", c.EUID, p.UID)
	}
	return c, nil
}

// refuseNetns is the one answer to a caller other than root whose
// CNI_NETNS the daemon will not act on, why it was refused noted on the
// audit line.
func refuseNetns(ctx context.Context, p control.Principal, why string) error {
	control.Note(ctx, "netns_refused", why)
	return cniErr(codes.PermissionDenied, cniv1.CodeRefused, fmt.Sprintf(
		"CNI_NETNS: not a network namespace %s may enter: a caller other than root passes the namespace open (phasegate-cni does), and must be able to setns(2) into it (own the user namespace that owns it, or hold CAP_SYS_ADMIN there)", p))
}
