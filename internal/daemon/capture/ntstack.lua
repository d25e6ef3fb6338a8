-- ntstack.lua: Wireshark dissector for ntstack frame captures.
--
-- A capture (`ntmon capture`, internal/daemon/capture) is pcapng with link type
-- LINKTYPE_USER0 (147): every packet is a 24-byte pseudo-header, then the
-- frame's payload. The layout is drawn in internal/daemon/capture/format.go; the
-- frame kinds in socklike/frame.go; leg frames in internal/daemon/proxy/leg.go.
-- gopacket's LayerTypeNTStack decodes the same fields.
--
--   tshark -r kv.pcapng -X lua_script:ntstack.lua -T fields -e ntstack.dir -e ntstack.kind -e ntstack.conn
--   wireshark -X lua_script:ntstack.lua kv.pcapng   (or copy this file to ~/.local/lib/wireshark/plugins/)
--
-- Display filters: ntstack.kind == 4 (DATA), ntstack.conn == 3, ntstack.local == 3,
-- ntstack.dir == 1 (rx), ntstack.ring == 255 (control), ntstack.leg.type, ntstack.text contains "SET".

local HDR = 24
local LEG_HDR = 13
local LEG_MAX = 262144 -- capture.LegMaxPayload

local p = Proto("ntstack", "ntstack frame")

local dirs = { [0] = "tx", [1] = "rx" }
local kinds = { [1] = "OPEN", [2] = "ACCEPT", [3] = "REFUSE", [4] = "DATA",
	[5] = "FIN", [6] = "CLOSE", [7] = "CREDIT", [8] = "MOVE", [9] = "WANT" }
local refusals = { [1] = "no listener", [2] = "backlog full", [3] = "no connection ids",
	[4] = "memory quota", [5] = "partitions full" }
local legtypes = { [1] = "data", [2] = "ack", [3] = "fin", [4] = "reset" }

local f = p.fields
f.version = ProtoField.uint8("ntstack.version", "Version")
f.hdrlen = ProtoField.uint8("ntstack.hdrlen", "Header length")
f.dir = ProtoField.uint8("ntstack.dir", "Direction", base.DEC, dirs)
f.dirname = ProtoField.string("ntstack.dirname", "Direction name")
f.ring = ProtoField.uint8("ntstack.ring", "Ring (data partition; 255: the control ring)")
f.kind = ProtoField.uint8("ntstack.kind", "Kind", base.DEC, kinds)
f.kindname = ProtoField.string("ntstack.kindname", "Kind name")
f.flags = ProtoField.uint8("ntstack.flags", "Flags", base.HEX)
f.leglink = ProtoField.bool("ntstack.flags.leg", "Link between ntproxies (DATA carries leg frames)", 8, nil, 0x01)
f.reserved = ProtoField.uint16("ntstack.reserved", "Reserved", base.HEX)
f.conn = ProtoField.uint32("ntstack.conn", "Connection id at the receiver")
f.localid = ProtoField.uint32("ntstack.local", "Capturing end's connection id")
f.len = ProtoField.uint32("ntstack.len", "Frame payload length")
f.link = ProtoField.uint32("ntstack.link", "Link id (FNV-1a of its name)", base.HEX)
f.port = ProtoField.uint16("ntstack.open.port", "Port")
f.window = ProtoField.uint32("ntstack.window", "Receive window")
f.gen = ProtoField.uint32("ntstack.gen", "Generation")
f.acceptid = ProtoField.uint32("ntstack.accept.id", "Acceptor's connection id")
f.dialgen = ProtoField.uint32("ntstack.accept.dialgen", "Dialer's generation (echo)")
f.code = ProtoField.uint32("ntstack.refuse.code", "Refusal", base.DEC, refusals)
f.consumed = ProtoField.uint64("ntstack.credit.consumed", "Bytes consumed")
f.floor = ProtoField.uint32("ntstack.credit.floor", "Credit floor (bit 31: credit in turns)")
f.inflight = ProtoField.uint32("ntstack.want.inflight", "Bytes sent beyond consumed")
f.partition = ProtoField.uint32("ntstack.move.partition", "New partition")
f.legtype = ProtoField.uint8("ntstack.leg.type", "Leg frame type", base.DEC, legtypes)
f.legseq = ProtoField.uint64("ntstack.leg.seq", "Leg sequence")
f.leglen = ProtoField.uint32("ntstack.leg.len", "Leg payload length")
f.payload = ProtoField.bytes("ntstack.payload", "Payload")
f.text = ProtoField.string("ntstack.text", "Payload as text (non-printable bytes as .)")

local e_malformed = ProtoExpert.new("ntstack.malformed", "Frame length does not fit its kind",
	expert.group.MALFORMED, expert.severity.WARN)
local e_snapped = ProtoExpert.new("ntstack.snapped", "Payload snapped by the capture",
	expert.group.UNDECODED, expert.severity.NOTE)
p.experts = { e_malformed, e_snapped }

-- Control kinds' payload lengths (ACCEPT: 12 or 16).
local bodylen = { [1] = 12, [2] = 12, [3] = 4, [5] = 0, [6] = 0, [7] = 16, [8] = 4, [9] = 16 }

local function printable(tvb, off, n)
	local s = tvb:raw(off, math.min(n, 128))
	return (s:gsub("[^\32-\126]", "."))
end

-- isleg: the DATA payload is exactly one well-formed leg frame, or a data
-- frame's header written apart from its payload (more than 8 KiB of it).
local function isleg(tvb, off, avail, length)
	if avail < LEG_HDR then return false end
	local typ = tvb(off, 1):uint()
	local n = tvb(off + 9, 4):le_uint()
	if typ < 1 or typ > 4 or n > LEG_MAX or (typ ~= 1 and n ~= 0) then return false end
	return LEG_HDR + n == length or (length == LEG_HDR and typ == 1)
end

function p.dissector(tvb, pinfo, tree)
	local total = tvb:len()
	if total < HDR or tvb(0, 1):uint() ~= 1 then return 0 end
	local hl = tvb(1, 1):uint()
	if hl < HDR or hl > total then return 0 end
	pinfo.cols.protocol = "ntstack"
	local dir, ring, kind = tvb(2, 1):uint(), tvb(3, 1):uint(), tvb(4, 1):uint()
	local flags = tvb(5, 1):uint()
	local conn, length = tvb(8, 4):le_uint(), tvb(16, 4):le_uint()
	local avail = total - hl
	local kname = kinds[kind] or ("kind " .. kind)

	local t = tree:add(p, tvb(0, total), "ntstack " .. (dirs[dir] or "?") .. " " .. kname)
	local h = t:add(p, tvb(0, hl), "Pseudo-header")
	h:add(f.version, tvb(0, 1))
	h:add(f.hdrlen, tvb(1, 1))
	h:add(f.dir, tvb(2, 1))
	h:add(f.dirname, tvb(2, 1), dirs[dir] or "?")
	local ri = h:add(f.ring, tvb(3, 1))
	if ring == 255 then ri:append_text(" (control)") end
	h:add(f.kind, tvb(4, 1))
	h:add(f.kindname, tvb(4, 1), kname)
	local fl = h:add(f.flags, tvb(5, 1))
	fl:add(f.leglink, tvb(5, 1))
	h:add_le(f.reserved, tvb(6, 2))
	h:add_le(f.conn, tvb(8, 4))
	h:add_le(f.localid, tvb(12, 4))
	h:add_le(f.len, tvb(16, 4))
	h:add_le(f.link, tvb(20, 4))

	local info = string.format("%s %s conn %d", dirs[dir] or "?", kname, conn)
	if ring == 255 then info = info .. " (control)" else info = info .. " ring " .. ring end
	local want = bodylen[kind]
	if (want ~= nil and length ~= want and not (kind == 2 and length == 16)) or (want == nil and kind ~= 4) then
		t:add_proto_expert_info(e_malformed)
	end
	if avail < length then t:add_proto_expert_info(e_snapped) end

	local b = hl
	local function has(n) return avail >= n end
	if kind == 1 then
		if has(2) then t:add_le(f.port, tvb(b, 2)); info = info .. " port " .. tvb(b, 2):le_uint() end
		if has(8) then t:add_le(f.window, tvb(b + 4, 4)) end
		if has(12) then t:add_le(f.gen, tvb(b + 8, 4)) end
	elseif kind == 2 then
		if has(4) then t:add_le(f.acceptid, tvb(b, 4)); info = info .. " id " .. tvb(b, 4):le_uint() end
		if has(8) then t:add_le(f.window, tvb(b + 4, 4)) end
		if has(12) then t:add_le(f.gen, tvb(b + 8, 4)) end
		if has(16) and length == 16 then t:add_le(f.dialgen, tvb(b + 12, 4)) end
	elseif kind == 3 then
		if has(4) then
			t:add_le(f.code, tvb(b, 4))
			info = info .. " " .. (refusals[tvb(b, 4):le_uint()] or "code " .. tvb(b, 4):le_uint())
		end
	elseif kind == 7 then
		if has(8) then t:add_le(f.consumed, tvb(b, 8)); info = info .. " consumed " .. tostring(tvb(b, 8):le_uint64()) end
		if has(12) then t:add_le(f.gen, tvb(b + 8, 4)) end
		if has(16) then t:add_le(f.floor, tvb(b + 12, 4)) end
	elseif kind == 9 then
		if has(8) then t:add_le(f.consumed, tvb(b, 8)); info = info .. " consumed " .. tostring(tvb(b, 8):le_uint64()) end
		if has(12) then t:add_le(f.gen, tvb(b + 8, 4)) end
		if has(16) then t:add_le(f.inflight, tvb(b + 12, 4)) end
	elseif kind == 8 then
		if has(4) then t:add_le(f.partition, tvb(b, 4)); info = info .. " to " .. tvb(b, 4):le_uint() end
	elseif kind == 4 then
		info = info .. " len " .. length
		local off, n = b, avail
		if bit.band(flags, 1) ~= 0 and isleg(tvb, b, avail, length) then
			local lt = t:add(p, tvb(b, LEG_HDR), "Leg frame")
			lt:add(f.legtype, tvb(b, 1))
			lt:add_le(f.legseq, tvb(b + 1, 8))
			lt:add_le(f.leglen, tvb(b + 9, 4))
			local ltype = tvb(b, 1):uint()
			info = info .. " leg " .. (legtypes[ltype] or "?") .. " seq " .. tostring(tvb(b + 1, 8):le_uint64())
			off, n = b + LEG_HDR, avail - LEG_HDR
		end
		if n > 0 then
			t:add(f.payload, tvb(off, n))
			local text = printable(tvb, off, n)
			t:add(f.text, tvb(off, math.min(n, 128)), text)
			info = info .. " " .. text:sub(1, 40)
		end
	end
	pinfo.cols.info = info
	return total
end

DissectorTable.get("wtap_encap"):add(wtap.USER0, p)
