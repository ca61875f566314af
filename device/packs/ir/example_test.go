package ir_test

import (
	"fmt"

	"github.com/mcpgate/mcpgate/device/packs/ir"
)

func ExampleEncode() {
	b, _ := ir.Encode(ir.Frame{Addr: ir.Broadcast, AFN: ir.AFNSendSlot, Data: []byte{2}})
	fmt.Printf("% X\n", b)
	f, err := ir.Decode(b)
	fmt.Println(f.AFN, f.Data, err)
	// Output:
	// 68 08 00 FF 12 02 13 16
	// AFN 0x12 [2] <nil>
}

func ExampleParseHex() {
	code, _ := ir.ParseHex("0xA1, 0xB2 c3")
	fmt.Printf("% X\n", code)
	// Output: A1 B2 C3
}
