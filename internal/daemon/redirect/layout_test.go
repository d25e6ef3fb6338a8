package redirect

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
)

func TestKeyLayout(t *testing.T) {
	from := netip.MustParseAddrPort("10.77.0.2:6379")
	k := makeKey(from)
	want := []byte{
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2, // ::ffff:10.77.0.2
		0x18, 0xeb, // 6379, big-endian
		0, 0, // pad
	}
	if !bytes.Equal(k[:], want) {
		t.Errorf("key %x, want %x", k[:], want)
	}
	if got := k.addrPort(); got != from {
		t.Errorf("key decodes to %v, want %v", got, from)
	}

	from6 := netip.MustParseAddrPort("[fd00::1]:443")
	k = makeKey(from6)
	if k[0] != 0xfd || k[15] != 1 || k[keyPortOff] != 0x01 || k[keyPortOff+1] != 0xbb {
		t.Errorf("IPv6 key %x", k[:])
	}
	if got := k.addrPort(); got != from6 {
		t.Errorf("key decodes to %v, want %v", got, from6)
	}
}

func TestValueLayout(t *testing.T) {
	to := netip.MustParseAddrPort("127.0.0.1:16379")
	v := makeValue(to)
	want := make([]byte, valueSize)
	copy(want, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1, 0x3f, 0xfb})
	if !bytes.Equal(v[:], want) {
		t.Errorf("value %x, want %x", v[:], want)
	}
	if got := v.target(); got != to {
		t.Errorf("value decodes to %v, want %v", got, to)
	}
	if v.count() != 0 {
		t.Errorf("new value counts %d, want 0", v.count())
	}
}

func TestCheckRule(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		from, to netip.AddrPort
		err      string // substring, or "" for success
	}{
		{ap("10.0.0.1:80"), ap("127.0.0.1:8080"), ""},
		{ap("[::1]:80"), ap("[::1]:8080"), ""},
		{ap("[::ffff:10.0.0.1]:80"), ap("127.0.0.1:8080"), ""}, // mapped is IPv4
		{ap("10.0.0.1:80"), ap("[::1]:8080"), "different address families"},
		{ap("[fe80::1%eth0]:80"), ap("[::1]:8080"), "zoned"},
		{ap("10.0.0.1:0"), ap("127.0.0.1:8080"), "port 0"},
		{ap("10.0.0.1:80"), netip.AddrPort{}, "to: invalid"},
	} {
		from, _, err := checkRule(tc.from, tc.to)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("checkRule(%v, %v): %v", tc.from, tc.to, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("checkRule(%v, %v) = %v, want error containing %q", tc.from, tc.to, err, tc.err)
		case tc.err == "" && from.Addr().Is4In6():
			t.Errorf("checkRule(%v, ...) kept the mapped form %v", tc.from, from)
		}
	}
}

func TestNotSupportedError(t *testing.T) {
	err := error(&NotSupportedError{What: "bpf", Err: os.ErrPermission})
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, os.ErrPermission) {
		t.Errorf("%v: want it to match ErrNotSupported and os.ErrPermission", err)
	}
	if got, want := err.Error(), "bpf: not supported: permission denied"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
