// Package ir is the infrared tool pack of mcpgate-device: the self.ir.*
// tools of py-xiaozhi, driving the common UART IR learning module over a
// serial port.
//
// The module speaks frames of
//
//	0x68, len_lo, len_hi, addr, AFN, data..., checksum, 0x16
//
// ([Encode], [Decode], [ReadFrame]). A [Module] runs one transaction at a
// time on the port, times out cleanly and reopens the port after it
// vanished (a USB adapter unplugged). A [Pack] turns a Module and a file of
// named codes into device tools:
//
//	pack, err := ir.New(ir.Config{Port: "/dev/ttyUSB0", CodesFile: "/var/lib/mcpgate-device/ir-codes.json"})
//	if err != nil { ... }
//	defer pack.Close()
//	for _, t := range pack.Tools() {
//		if err := srv.AddTool(t); err != nil { ... }
//	}
//
// Every failure is returned as a tool error carrying the precise reason, so
// a py-xiaozhi or spec profile server reports it as an isError result.
package ir
