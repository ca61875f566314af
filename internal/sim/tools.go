package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"

	"github.com/mcpgate/mcpgate/device"
)

// board is a simulated device's hardware state.
type board struct {
	mu         sync.Mutex // guards the fields below
	volume     int
	brightness int
	theme      string
	lampOn     bool
	color      [3]int
	assetsURL  string
	battery    int
	charging   bool
}

func newBoard(n int) *board {
	// Vary the battery across the fleet so status replies differ.
	return &board{volume: 70, brightness: 75, theme: "light", battery: 50 + n%51, charging: n%3 == 0}
}

// deviceStatus mirrors the JSON firmware's GetDeviceStatusJson builds, plus
// the lamp a lamp board reports.
type deviceStatus struct {
	AudioSpeaker struct {
		Volume int `json:"volume"`
	} `json:"audio_speaker"`
	Screen struct {
		Brightness int    `json:"brightness"`
		Theme      string `json:"theme"`
	} `json:"screen"`
	Battery struct {
		Level    int  `json:"level"`
		Charging bool `json:"charging"`
	} `json:"battery"`
	Network struct {
		Type   string `json:"type"`
		SSID   string `json:"ssid"`
		Signal string `json:"signal"`
	} `json:"network"`
	Lamp struct {
		Power bool `json:"power"`
	} `json:"lamp"`
}

func (b *board) status() deviceStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s deviceStatus
	s.AudioSpeaker.Volume = b.volume
	s.Screen.Brightness = b.brightness
	s.Screen.Theme = b.theme
	s.Battery.Level = b.battery
	s.Battery.Charging = b.charging
	s.Network.Type = "wifi"
	s.Network.SSID = "mcpgate-sim"
	s.Network.Signal = "strong"
	s.Lamp.Power = b.lampOn
	return s
}

// Descriptions copied from firmware, because models pick tools by them and a
// gateway may rewrite the tool names they mention.
const (
	descDeviceStatus = "Provides the real-time information of the device, including the current status of the audio speaker, screen, battery, network, etc.\n" +
		"Use this tool for: \n" +
		"1. Answering questions about current condition (e.g. what is the current volume of the audio speaker?)\n" +
		"2. As the first step to control the device (e.g. turn up / down the volume of the audio speaker, etc.)"
	descSetVolume = "Set the volume of the audio speaker. If the current volume is unknown, you must call `self.get_device_status` tool first and then call this tool."
	descTakePhoto = "Take a photo and explain it. Use this tool after the user asks you to see something.\n" +
		"Args:\n" +
		"  `question`: The question that you want to ask about the photo.\n" +
		"Return:\n" +
		"  A JSON object that provides the photo information."
	descUpgrade = "Upgrade firmware from a specific URL. This will download and install the firmware, then reboot the device."
)

// tools returns the device's catalog in firmware order: common tools, board
// tools, then user-only tools.
func (d *Device) tools() []device.Tool {
	b := d.board
	ok := func(context.Context, device.Args) (any, error) { return true, nil }
	tools := []device.Tool{
		{
			Name:        "self.get_device_status",
			Description: descDeviceStatus,
			Handler: func(context.Context, device.Args) (any, error) {
				// Firmware returns the status as a JSON string.
				js, err := json.Marshal(b.status())
				return string(js), err
			},
		},
		{
			Name:        "self.audio_speaker.set_volume",
			Description: descSetVolume,
			Properties:  []device.Property{device.Int("volume", 0, 100)},
			Handler: func(_ context.Context, a device.Args) (any, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.volume = a.Int("volume")
				return true, nil
			},
		},
		{
			Name:        "self.screen.set_brightness",
			Description: "Set the brightness of the screen.",
			Properties:  []device.Property{device.Int("brightness", 0, 100)},
			Handler: func(_ context.Context, a device.Args) (any, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.brightness = a.Int("brightness")
				return true, nil
			},
		},
		{
			Name:        "self.screen.set_theme",
			Description: "Set the theme of the screen. The theme can be `light` or `dark`.",
			Properties:  []device.Property{device.Str("theme")},
			Handler: func(_ context.Context, a device.Args) (any, error) {
				theme := a.String("theme")
				if theme != "light" && theme != "dark" {
					return false, nil // firmware: unknown themes are not an error
				}
				b.mu.Lock()
				defer b.mu.Unlock()
				b.theme = theme
				return true, nil
			},
		},
		{
			Name:        "self.camera.take_photo",
			Description: descTakePhoto,
			Properties:  []device.Property{device.Str("question")},
			Handler:     d.takePhoto,
		},
		// Board tools, as a lamp board and an LED-strip board add them.
		{
			Name:        "self.lamp.get_state",
			Description: "Get the power state of the lamp",
			Handler: func(context.Context, device.Args) (any, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				return `{"power": ` + strconv.FormatBool(b.lampOn) + `}`, nil
			},
		},
		{
			Name:        "self.lamp.turn_on",
			Description: "Turn on the lamp",
			Handler:     func(context.Context, device.Args) (any, error) { return b.setLamp(true), nil },
		},
		{
			Name:        "self.lamp.turn_off",
			Description: "Turn off the lamp",
			Handler:     func(context.Context, device.Args) (any, error) { return b.setLamp(false), nil },
		},
		{
			Name:        "self.led_strip.set_all_color",
			Description: "Set the color of all leds.",
			Properties: []device.Property{
				device.Int("red", 0, 255), device.Int("green", 0, 255), device.Int("blue", 0, 255),
			},
			Handler: func(_ context.Context, a device.Args) (any, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.color = [3]int{a.Int("red"), a.Int("green"), a.Int("blue")}
				return true, nil
			},
		},
	}
	tools = append(tools, fillerTools(d.cfg.ExtraTools)...)
	if d.cfg.Profile == device.ProfileSpec {
		tools = append(tools, d.contentTool())
	}
	return append(tools,
		device.Tool{
			Name:        "self.get_system_info",
			Description: "Get the system information",
			UserOnly:    true,
			Handler:     func(context.Context, device.Args) (any, error) { return d.systemInfo() },
		},
		device.Tool{Name: "self.reboot", Description: "Reboot the system", UserOnly: true, Handler: ok},
		device.Tool{
			Name:        "self.upgrade_firmware",
			Description: descUpgrade,
			// Firmware passes its description where the default belongs, so
			// url is optional with this odd default. Reproduced on purpose.
			Properties: []device.Property{device.StrDefault("url", "The URL of the firmware binary file to download and install")},
			UserOnly:   true,
			Handler:    ok,
		},
		device.Tool{
			Name:        "self.screen.get_info",
			Description: "Information about the screen, including width, height, etc.",
			UserOnly:    true,
			Handler: func(context.Context, device.Args) (any, error) {
				return map[string]any{"width": 240, "height": 240, "monochrome": false}, nil
			},
		},
		device.Tool{
			Name:        "self.screen.snapshot",
			Description: "Snapshot the screen and upload it to a specific URL",
			Properties:  []device.Property{device.Str("url"), device.IntDefault("quality", 80, 1, 100)},
			UserOnly:    true,
			Handler:     d.snapshot,
		},
		device.Tool{
			Name:        "self.screen.preview_image",
			Description: "Preview an image on the screen",
			Properties:  []device.Property{device.Str("url")},
			UserOnly:    true,
			Handler:     d.previewImage,
		},
		device.Tool{
			Name:        "self.assets.set_download_url",
			Description: "Set the download url for the assets",
			Properties:  []device.Property{device.Str("url")},
			UserOnly:    true,
			Handler: func(_ context.Context, a device.Args) (any, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.assetsURL = a.String("url")
				return true, nil
			},
		},
	)
}

func (b *board) setLamp(on bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lampOn = on
	return true
}

// fillerTools returns n tools whose long descriptions push the catalog over
// several pages (about nine of them fit one 8000-byte page).
func fillerTools(n int) []device.Tool {
	tools := make([]device.Tool, n)
	for i := range tools {
		var desc strings.Builder
		fmt.Fprintf(&desc, "Filler tool %d of the simulator. ", i)
		for desc.Len() < 700 {
			desc.WriteString("It exists to make the catalog span several tools/list pages, so that gateways exercise cursor paging. ")
		}
		tools[i] = device.Tool{
			Name:        fmt.Sprintf("self.sim.filler_%03d", i),
			Description: desc.String(),
			Properties:  []device.Property{device.IntDefault("level", 5, 0, 10), device.StrDefault("mode", "auto")},
			Handler: func(_ context.Context, a device.Args) (any, error) {
				return map[string]any{"filler": i, "level": a.Int("level"), "mode": a.String("mode")}, nil
			},
		}
	}
	return tools
}

// contentTool returns a tool whose result holds one item of every MCP
// content type plus structured content, for pass-through tests.
func (d *Device) contentTool() device.Tool {
	return device.Tool{
		Name:        "self.sim.all_content",
		Description: "Returns one item of every MCP content type (text, image, audio, embedded resource, resource link) and structured content.",
		Handler: func(context.Context, device.Args) (any, error) {
			png, err := tinyPNG()
			if err != nil {
				return nil, err
			}
			status := d.board.status()
			statusJSON, err := json.Marshal(status)
			if err != nil {
				return nil, err
			}
			prio := 0.9
			size := int64(2048)
			text := device.TextContent("Here is every kind of content a tool can return.")
			text.Annotations = &device.Annotations{Audience: []string{"user", "assistant"}, Priority: &prio}
			image := device.ImageContent(png, "image/png")
			image.Annotations = &device.Annotations{Audience: []string{"user"}, LastModified: "2025-01-01T00:00:00Z"}
			return &device.ToolResult{
				Content: []device.Content{
					text,
					image,
					device.AudioContent(tinyWAV(), "audio/wav"),
					{Type: "resource", Resource: &device.ResourceContents{
						URI: d.resourceURI("status.json"), MIMEType: "application/json", Text: string(statusJSON),
					}},
					{Type: "resource_link", URI: "https://example.com/sim/manual.pdf", Name: "manual.pdf",
						Title: "Device manual", Description: "The simulated device's manual", MIMEType: "application/pdf", Size: &size},
				},
				StructuredContent: status,
				Meta:              map[string]any{"mcpgate.sim/device": d.MAC},
			}, nil
		},
	}
}

// resourceURI names one of the device's resources. The MAC's colons would
// read as a port separator in the URI's host (RFC 3986 allows none in a
// reg-name), and clients that validate URIs, like the Python SDK, reject the
// whole result; dashes keep the host valid and still name the device.
func (d *Device) resourceURI(name string) string {
	return "sim://" + strings.ReplaceAll(d.MAC, ":", "-") + "/" + name
}

// systemInfo mirrors the shape of firmware's system information JSON.
func (d *Device) systemInfo() (string, error) {
	type chip struct {
		Model    int `json:"model"`
		Cores    int `json:"cores"`
		Revision int `json:"revision"`
		Features int `json:"features"`
	}
	type application struct {
		Name        string `json:"name"`
		Version     string `json:"version"`
		CompileTime string `json:"compile_time"`
		IDFVersion  string `json:"idf_version"`
		ELFSHA256   string `json:"elf_sha256"`
	}
	type partition struct {
		Label   string `json:"label"`
		Type    int    `json:"type"`
		Subtype int    `json:"subtype"`
		Address int    `json:"address"`
		Size    int    `json:"size"`
	}
	name, version := serverInfo(d.cfg.Profile)
	js, err := json.Marshal(struct {
		Version             int         `json:"version"`
		Language            string      `json:"language"`
		FlashSize           int         `json:"flash_size"`
		MinimumFreeHeapSize int         `json:"minimum_free_heap_size"`
		MACAddress          string      `json:"mac_address"`
		UUID                string      `json:"uuid"`
		ChipModelName       string      `json:"chip_model_name"`
		ChipInfo            chip        `json:"chip_info"`
		Application         application `json:"application"`
		PartitionTable      []partition `json:"partition_table"`
		OTA                 struct {
			Label string `json:"label"`
		} `json:"ota"`
		Board map[string]any `json:"board"`
	}{
		Version: 2, Language: "zh-CN", FlashSize: 16 << 20, MinimumFreeHeapSize: 81920,
		MACAddress: d.MAC, UUID: d.ClientID, ChipModelName: "esp32s3",
		ChipInfo:    chip{Model: 9, Cores: 2, Revision: 2, Features: 18},
		Application: application{Name: "xiaozhi", Version: version, CompileTime: "2025-01-01T00:00:00Z", IDFVersion: "v5.4.1", ELFSHA256: strings.Repeat("0", 64)},
		PartitionTable: []partition{
			{Label: "nvs", Type: 1, Subtype: 2, Address: 0x9000, Size: 0x4000},
			{Label: "ota_0", Type: 0, Subtype: 16, Address: 0x20000, Size: 0x3f0000},
		},
		OTA: struct {
			Label string `json:"label"`
		}{"ota_0"},
		Board: map[string]any{"type": name, "name": name, "ssid": "mcpgate-sim", "rssi": -50, "channel": 6, "ip": "192.0.2.1", "mac": d.MAC},
	})
	return string(js), err
}

// Errors with the texts firmware sends.
var (
	errNoVision      = errors.New("Image explain URL or token is not set")
	errUploadFailed  = errors.New("Failed to upload photo")
	errVisionConnect = errors.New("Failed to connect to explain URL")
)

// takePhoto uploads a photo to the vision endpoint from initialize, as
// firmware does, and returns the endpoint's answer verbatim.
func (d *Device) takePhoto(ctx context.Context, a device.Args) (any, error) {
	v := d.Server.Vision()
	if v.URL == "" {
		return nil, errNoVision
	}
	photo, err := tinyJPEG()
	if err != nil {
		return nil, err
	}
	body, contentType, err := multipartBody("camera.jpg", photo, "question", a.String("question"))
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.URL, body)
	if err != nil {
		return nil, errVisionConnect
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Device-Id", d.MAC)
	req.Header.Set("Client-Id", d.ClientID)
	if v.Token != "" {
		req.Header.Set("Authorization", "Bearer "+v.Token)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		d.log.Debug("photo upload failed", "error", err)
		return nil, errVisionConnect
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		d.log.Debug("photo upload rejected", "status", resp.StatusCode)
		return nil, errUploadFailed
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, errUploadFailed
	}
	return string(answer), nil
}

// snapshot uploads a screen snapshot to the given URL. Its error texts, like
// previewImage's, are firmware's.
func (d *Device) snapshot(ctx context.Context, a device.Args) (any, error) {
	url := a.String("url")
	photo, err := tinyJPEG()
	if err != nil {
		return nil, err
	}
	body, contentType, err := multipartBody("screenshot.jpg", photo, "", "")
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return nil, fmt.Errorf("Failed to open URL: %s", url)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("Failed to open URL: %s", url)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("Unexpected status code: %d", resp.StatusCode)
	}
	return true, nil
}

// previewImage downloads an image to show it.
func (d *Device) previewImage(ctx context.Context, a device.Args) (any, error) {
	url := a.String("url")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("Failed to open URL: %s", url)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("Failed to open URL: %s", url)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("Unexpected status code: %d", resp.StatusCode)
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<20)); err != nil {
		return nil, fmt.Errorf("Failed to download image: %s", url)
	}
	return true, nil
}

// multipartBody builds firmware's upload form: an optional text field first,
// then the JPEG as "file".
func multipartBody(filename string, jpeg []byte, field, value string) (*bytes.Buffer, string, error) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary("----ESP32_CAMERA_BOUNDARY"); err != nil {
		return nil, "", err
	}
	if field != "" {
		if err := w.WriteField(field, value); err != nil {
			return nil, "", err
		}
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, filename))
	h.Set("Content-Type", "image/jpeg")
	part, err := w.CreatePart(h)
	if err != nil {
		return nil, "", err
	}
	if _, err := part.Write(jpeg); err != nil {
		return nil, "", err
	}
	if err := w.Close(); err != nil {
		return nil, "", err
	}
	return &buf, w.FormDataContentType(), nil
}
