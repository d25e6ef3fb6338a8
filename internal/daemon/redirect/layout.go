package redirect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// MaxRules is the capacity of the rule map. A gateway has a handful of
// rules; 1024 entries of 20+32 bytes, plus the kernel's header of about 50
// bytes per element, preallocate roughly 100 KiB of kernel memory.
const MaxRules = 1024

// Rule map layout, drawn in the package doc.
const (
	keyAddrOff = 0  // [16]byte, destination in 16-byte form, network order
	keyPortOff = 16 // big-endian u16
	keySize    = 20 // 16 + 2 + 2 bytes of zero padding

	valAddrOff  = 0  // [16]byte, target in 16-byte form, network order
	valPortOff  = 16 // big-endian u16
	valCountOff = 24 // u64 in host byte order, atomically added to in BPF
	valueSize   = 32 // 24 + 8; pad 18..24 keeps the count 8-byte aligned

	// ip4Off is where an IPv4 address sits inside the 16-byte
	// IPv4-mapped form ::ffff:a.b.c.d.
	ip4Off = 12
)

type ruleKey [keySize]byte

type ruleValue [valueSize]byte

func makeKey(from netip.AddrPort) ruleKey {
	var k ruleKey
	a := from.Addr().As16() // IPv4 becomes ::ffff:a.b.c.d
	copy(k[keyAddrOff:], a[:])
	binary.BigEndian.PutUint16(k[keyPortOff:], from.Port())
	return k
}

func (k ruleKey) addrPort() netip.AddrPort {
	a := netip.AddrFrom16([16]byte(k[keyAddrOff : keyAddrOff+16])).Unmap()
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(k[keyPortOff:]))
}

func makeValue(to netip.AddrPort) ruleValue {
	var v ruleValue
	a := to.Addr().As16()
	copy(v[valAddrOff:], a[:])
	binary.BigEndian.PutUint16(v[valPortOff:], to.Port())
	return v
}

func (v ruleValue) target() netip.AddrPort {
	a := netip.AddrFrom16([16]byte(v[valAddrOff : valAddrOff+16])).Unmap()
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(v[valPortOff:]))
}

func (v ruleValue) count() uint64 { return binary.NativeEndian.Uint64(v[valCountOff:]) }

// checkRule returns from and to unmapped (an IPv4-mapped address is a
// rule for IPv4), or an error if they cannot form a rule.
func checkRule(from, to netip.AddrPort) (netip.AddrPort, netip.AddrPort, error) {
	from, err := checkAddrPort(from)
	if err != nil {
		return from, to, fmt.Errorf("from: %w", err)
	}
	to, err = checkAddrPort(to)
	if err != nil {
		return from, to, fmt.Errorf("to: %w", err)
	}
	if from.Addr().Is4() != to.Addr().Is4() {
		return from, to, errors.New("from and to are of different address families")
	}
	return from, to, nil
}

func checkAddrPort(ap netip.AddrPort) (netip.AddrPort, error) {
	switch {
	case !ap.IsValid():
		return ap, errors.New("invalid address")
	case ap.Addr().Zone() != "":
		return ap, fmt.Errorf("%v: zoned address", ap)
	case ap.Port() == 0:
		return ap, fmt.Errorf("%v: port 0", ap)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}
