package main

import (
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// connOwner returns which of pids owns the local end of a loopback TCP
// connection, given that end's address (what the peer sees as remote):
// /proc/net/tcp maps the address to a socket inode, and the owner has that
// socket among its file descriptors. Linux only, like the suite.
func connOwner(addr string, pids map[int]*proc) (int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return 0, fmt.Errorf("%s: not an IPv4 address", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return 0, err
	}
	// /proc/net/tcp writes an IPv4 address as the hex of its 32-bit value
	// in host (little-endian) order, and the port in hex.
	want := strings.ToUpper(hex.EncodeToString([]byte{ip[3], ip[2], ip[1], ip[0]})) + ":" + fmt.Sprintf("%04X", p)
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	// Several lines may have that local address: a connection closed earlier
	// from the same port to another peer lingers in TIME_WAIT with no owner
	// (inode 0), and may be listed before the live one. Every live socket
	// with the address is a candidate.
	targets := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == want && f[9] != "0" {
			targets["socket:["+f[9]+"]"] = true
		}
	}
	if len(targets) == 0 {
		return 0, fmt.Errorf("no socket bound to %s", addr)
	}
	for pid := range pids {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			if link, err := os.Readlink(fd); err == nil && targets[link] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("none of the processes %v owns %s", keys(pids), addr)
}

func keys(m map[int]*proc) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
