package console_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestConsoleCluster: the console of one of two cluster nodes on one
// PostgreSQL store shows each device's node: a Node column on the devices
// page, the node on the device page, a Node column on the events page; a
// device that leaves is on no node. (TestConsoleOpen checks that a single
// node shows no Node column.)
func TestConsoleCluster(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	ctx := browser(t, 1280, 900)
	east := startGateway(t, gateway.Config{StoreDSN: dsn,
		Cluster: &cluster.Config{Name: "console", NodeID: "east", Listen: "127.0.0.1:0"}})
	west := startGateway(t, gateway.Config{StoreDSN: dsn,
		Cluster: &cluster.Config{Name: "console", NodeID: "west", Listen: "127.0.0.1:0", Routes: []string{east.ClusterRoute()}}})
	base := "http://" + west.Addr()

	run(t, ctx, "open west's console", chromedp.Navigate(base+"/"))
	waitJS(t, ctx, "the devices table", `!!document.querySelector('#devices') && document.getElementById('count-online')?.textContent === '0'`)
	d1, stop1 := simDevice(t, east, device.ProfileESP32, 1)
	d2, _ := simDevice(t, west, device.ProfileESP32, 2)
	for _, d := range []string{d1.MAC, d2.MAC} {
		waitJS(t, ctx, d+" ready in west's table", rowState(d)+` === 'ready'`)
	}
	nodeCell := func(id string) string {
		return `document.querySelector('#devices tr[data-id="` + id + `"] td.node')?.textContent`
	}
	waitJS(t, ctx, "a Node column with each device's node",
		`[...document.querySelectorAll('#devices thead th')].map(th => th.textContent).join(',') === 'State,Alias,Id,Node,Transport,Dialect,Firmware,Tools,Last seen,Last error' && `+
			nodeCell(d1.MAC)+` === 'east' && `+nodeCell(d2.MAC)+` === 'west'`)
	checkPage(t, ctx, "devices (cluster)")
	screenshot(t, ctx, "devices-cluster")

	// Search finds a node's devices.
	run(t, ctx, "search by node", chromedp.SendKeys(chromedp.CSS("#dev-search"), "west"))
	waitJS(t, ctx, "west's device only", `document.querySelectorAll('#devices tbody tr').length === 1 && !!document.querySelector('#devices tr[data-id="`+d2.MAC+`"]')`)

	run(t, ctx, "the device page of east's device", chromedp.Navigate(base+"/#/device/"+d1.MAC))
	waitJS(t, ctx, "its node", `document.getElementById('device-node')?.textContent === ' · node east'`)

	run(t, ctx, "events page", chromedp.Navigate(base+"/#/events"))
	rowNode := func(id, node string) string {
		return `[...document.querySelectorAll('#events tbody tr[data-type="device_online"]')].some(r => r.innerText.includes('` + id[len(id)-2:] + `') && r.querySelector('td.node')?.textContent === '` + node + `')`
	}
	waitJS(t, ctx, "a Node column on the events page",
		`[...document.querySelectorAll('#events thead th')].map(th => th.textContent).join(',') === 'Time,Kind,Device,Node,Details'`)
	waitJS(t, ctx, "each device_online with its node", rowNode(d1.MAC, "east")+` && `+rowNode(d2.MAC, "west"))
	checkPage(t, ctx, "events (cluster)")
	screenshot(t, ctx, "events-cluster")

	// The overview names the node and the members it sees.
	run(t, ctx, "overview", chromedp.Navigate(base+"/#/overview"))
	waitJS(t, ctx, "west among its members", `document.getElementById('overview-info')?.textContent.includes('· node west of east, west ·')`)

	// A device that leaves is on no node.
	stop1()
	run(t, ctx, "devices page", chromedp.Navigate(base+"/#/devices"))
	waitJS(t, ctx, "east's device offline, on no node", rowState(d1.MAC)+` === 'offline' && `+nodeCell(d1.MAC)+` === '' && `+nodeCell(d2.MAC)+` === 'west'`)
}
