package redirect

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Offsets into struct bpf_sock_addr (include/uapi/linux/bpf.h), the
// context of cgroup/connect4 and cgroup/connect6 programs:
//
//	struct bpf_sock_addr {
//		__u32 user_family;  //  0
//		__u32 user_ip4;     //  4, network byte order
//		__u32 user_ip6[4];  //  8, network byte order
//		__u32 user_port;    // 24, network byte order in the low 16 bits
//		__u32 family;       // 28
//		__u32 type;         // 32, SOCK_STREAM, SOCK_DGRAM, ...
//		...
//	};
const (
	ctxUserIP4  = 4
	ctxUserIP6  = 8
	ctxUserPort = 24
	ctxType     = 32

	sockStream = 1 // SOCK_STREAM

	// keyStack is the frame-pointer offset of the key the program builds:
	// 24 bytes zeroed, the first keySize of them used.
	keyStack = -24
)

// connectInsns returns a cgroup/connect4 (ipv6 false) or cgroup/connect6
// program that looks the destination up in the rule map with descriptor
// rulesFD and, on a hit, rewrites it to the rule's target and adds one to
// the rule's count. It always returns 1 (allow the connect).
//
// All addresses and ports are copied as memory: a word loaded from the
// context and stored to the stack keeps its bytes in order, so network
// byte order is preserved without swaps. Loading user_port as a u32 and
// storing its low half copies its first two bytes, the port in network
// order.
func connectInsns(rulesFD int, ipv6 bool) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // R6 = ctx, kept across the helper call
		asm.LoadMem(asm.R2, asm.R6, ctxType, asm.Word),
		asm.JNE.Imm(asm.R2, sockStream, "allow"), // not TCP: leave it alone

		asm.Mov.Imm(asm.R2, 0), // asm has no 64-bit store of an immediate
		asm.StoreMem(asm.RFP, keyStack, asm.R2, asm.DWord),
		asm.StoreMem(asm.RFP, keyStack+8, asm.R2, asm.DWord),
		asm.StoreMem(asm.RFP, keyStack+16, asm.R2, asm.DWord),
	}
	if ipv6 {
		for i := int16(0); i < 16; i += 4 {
			insns = append(insns,
				asm.LoadMem(asm.R2, asm.R6, ctxUserIP6+i, asm.Word),
				asm.StoreMem(asm.RFP, keyStack+keyAddrOff+i, asm.R2, asm.Word),
			)
		}
	} else {
		insns = append(insns,
			// ::ffff:a.b.c.d: bytes 10 and 11 are 0xff, 0..9 already zero.
			asm.StoreImm(asm.RFP, keyStack+keyAddrOff+10, 0xffff, asm.Half),
			asm.LoadMem(asm.R2, asm.R6, ctxUserIP4, asm.Word),
			asm.StoreMem(asm.RFP, keyStack+keyAddrOff+ip4Off, asm.R2, asm.Word),
		)
	}
	insns = append(insns,
		asm.LoadMem(asm.R2, asm.R6, ctxUserPort, asm.Word),
		asm.StoreMem(asm.RFP, keyStack+keyPortOff, asm.R2, asm.Half),

		asm.LoadMapPtr(asm.R1, rulesFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyStack),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "allow"), // no rule
	)
	if ipv6 {
		for i := int16(0); i < 16; i += 4 {
			insns = append(insns,
				asm.LoadMem(asm.R2, asm.R0, valAddrOff+i, asm.Word),
				asm.StoreMem(asm.R6, ctxUserIP6+i, asm.R2, asm.Word),
			)
		}
	} else {
		insns = append(insns,
			asm.LoadMem(asm.R2, asm.R0, valAddrOff+ip4Off, asm.Word),
			asm.StoreMem(asm.R6, ctxUserIP4, asm.R2, asm.Word),
		)
	}
	return append(insns,
		// The context's user_port takes only u32 stores; the upper half is 0.
		asm.LoadMem(asm.R2, asm.R0, valPortOff, asm.Half),
		asm.StoreMem(asm.R6, ctxUserPort, asm.R2, asm.Word),
		asm.Mov.Imm(asm.R2, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R2, asm.DWord, valCountOff),

		asm.Mov.Imm(asm.R0, 1).WithSymbol("allow"),
		asm.Return(),
	)
}

func connectSpec(rulesFD int, ipv6 bool) *ebpf.ProgramSpec {
	spec := &ebpf.ProgramSpec{
		Name:         "ntredir_conn4",
		Type:         ebpf.CGroupSockAddr,
		AttachType:   ebpf.AttachCGroupInet4Connect,
		Instructions: connectInsns(rulesFD, false),
		License:      "Apache-2.0", // uses no GPL-only helper
	}
	if ipv6 {
		spec.Name = "ntredir_conn6"
		spec.AttachType = ebpf.AttachCGroupInet6Connect
		spec.Instructions = connectInsns(rulesFD, true)
	}
	return spec
}
