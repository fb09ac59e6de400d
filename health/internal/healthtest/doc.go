// Package healthtest holds what the tests of health and of its dialects in
// subpackages (health/sdnotify) share.
//
// It holds a lifecycle rig that holds its start and its drain open where a
// test wants them, a socket that listens the way systemd does, and the waits
// the tests bound themselves by. It lives in one place so that the tests of
// each dialect drive the same lifecycle, and under internal so that it is no
// part of the library's surface.
package healthtest
