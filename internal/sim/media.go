package sim

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
)

// tinyJPEG returns a small valid JPEG, the simulated camera's photo.
func tinyJPEG() ([]byte, error) {
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, testPattern(16, 16), &jpeg.Options{Quality: 80}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tinyPNG returns a small valid PNG for image content.
func tinyPNG() ([]byte, error) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, testPattern(4, 4)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func testPattern(w, h int) image.Image {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{R: uint8(x * 255 / w), G: uint8(y * 255 / h), B: 128, A: 255})
		}
	}
	return img
}

// tinyWAV returns 20 ms of 8 kHz 16-bit mono silence as a WAV file.
func tinyWAV() []byte {
	const (
		rate    = 8000
		samples = 160
		dataLen = samples * 2
	)
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) } // writes to a bytes.Buffer cannot fail
	b.WriteString("RIFF")
	le(uint32(36 + dataLen))
	b.WriteString("WAVEfmt ")
	le(uint32(16))       // fmt chunk size
	le(uint16(1))        // PCM
	le(uint16(1))        // mono
	le(uint32(rate))     // sample rate
	le(uint32(rate * 2)) // byte rate
	le(uint16(2))        // block align
	le(uint16(16))       // bits per sample
	b.WriteString("data")
	le(uint32(dataLen))
	b.Write(make([]byte, dataLen))
	return b.Bytes()
}
