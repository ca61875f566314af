package vision

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the bounds on stored photos (docs/vision.md, "Stored photos").
const (
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultMaxPerDevice   = 100
	DefaultMaxDeviceBytes = 100 << 20
	DefaultMaxTotalBytes  = 1 << 30
	DefaultSweepInterval  = time.Hour
	DefaultUploadRate     = 0.2 // uploads per second per device: one every 5 s
	DefaultUploadBurst    = 5
)

// Reasons a stored photo is deleted, as the "reason" label of
// mcpgate_photos_deleted_total carries them.
const (
	DeletedAge         = "age"          // older than Config.Retention
	DeletedDeviceCount = "device_count" // its device holds more than Config.MaxPerDevice
	DeletedDeviceBytes = "device_bytes" // its device holds more than Config.MaxDeviceBytes
	DeletedTotalBytes  = "total_bytes"  // all devices hold more than Config.MaxTotalBytes
)

var deleteReasons = []string{DeletedAge, DeletedDeviceCount, DeletedDeviceBytes, DeletedTotalBytes}

// shelf is what the service knows of the photos on disk, so that an upload
// bounds them without listing the directory. Sweep rebuilds it from the
// disk; uploads keep it up to date in between.
//
// A photo in use (being stored or explained) is never deleted: a bound
// may then be exceeded until its upload ends, which enforces it again.
type shelf struct {
	mu      sync.Mutex
	devices map[string]*shelfDevice // guarded by mu; by device directory name
	photos  int                     // guarded by mu
	bytes   int64                   // guarded by mu
	inUse   map[string]int          // guarded by mu; by dir/id, uploads using the photo
}

// shelfDevice is one device directory's photos, oldest first.
type shelfDevice struct {
	photos []*shelved
	bytes  int64
}

// shelved is one stored photo: its image and metadata files.
type shelved struct {
	dir, id string
	ext     string    // of the image file; "" when only metadata is left
	taken   time.Time // from the id, to the second
	mod     time.Time // of the image file: orders photos taken in one second
	bytes   int64     // image and metadata together
}

func (p *shelved) key() string { return p.dir + "/" + p.id }

func older(a, b *shelved) int {
	return cmp.Or(a.taken.Compare(b.taken), a.mod.Compare(b.mod), strings.Compare(a.id, b.id))
}

// photoMetrics are the photo collectors, registered on Config.Registerer.
func (s *Service) photoMetrics() []prometheus.Collector {
	s.deleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_photos_deleted_total", Help: "Stored camera photos deleted, by reason: age, device_count, device_bytes, total_bytes (see docs/vision.md).",
	}, []string{"reason"})
	for _, r := range deleteReasons {
		s.deleted.WithLabelValues(r)
	}
	stored := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mcpgate_photos_stored", Help: "Camera photos stored, all devices together."},
		func() float64 { n, _ := s.shelfSize(); return float64(n) })
	bytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mcpgate_photos_bytes", Help: "Bytes of the stored camera photos and their metadata, all devices together."},
		func() float64 { _, b := s.shelfSize(); return float64(b) })
	return []prometheus.Collector{s.deleted, stored, bytes}
}

func (s *Service) shelfSize() (int, int64) {
	s.shelf.mu.Lock()
	defer s.shelf.mu.Unlock()
	return s.shelf.photos, s.shelf.bytes
}

// hold marks a photo in use until release.
func (s *Service) hold(dir, id string) {
	s.shelf.mu.Lock()
	defer s.shelf.mu.Unlock()
	s.shelf.inUse[dir+"/"+id]++
}

// release ends a hold, and applies the bounds the photo may have kept
// from being applied while it was in use.
func (s *Service) release(dir, id string) {
	s.shelf.mu.Lock()
	defer s.shelf.mu.Unlock()
	k := dir + "/" + id
	if s.shelf.inUse[k]--; s.shelf.inUse[k] <= 0 {
		delete(s.shelf.inUse, k)
	}
	s.boundLocked("upload", dir)
}

// added records a photo just written (or its metadata rewritten) with
// its size on disk, then applies the bounds: the uploader's device's and
// the total, and the retention.
func (s *Service) added(dir, id, ext string, taken time.Time, bytes int64) {
	s.shelf.mu.Lock()
	defer s.shelf.mu.Unlock()
	d := s.shelf.devices[dir]
	if d == nil {
		d = &shelfDevice{}
		s.shelf.devices[dir] = d
	}
	if i := slices.IndexFunc(d.photos, func(p *shelved) bool { return p.id == id }); i >= 0 {
		p := d.photos[i]
		d.bytes += bytes - p.bytes
		s.shelf.bytes += bytes - p.bytes
		p.bytes, p.ext = bytes, ext
	} else {
		p := &shelved{dir: dir, id: id, ext: ext, taken: taken.Truncate(time.Second), mod: s.cfg.Now(), bytes: bytes}
		d.photos = append(d.photos, p)
		slices.SortStableFunc(d.photos, older) // nearly always in place already
		d.bytes += bytes
		s.shelf.photos++
		s.shelf.bytes += bytes
	}
	s.boundLocked("upload", dir)
}

// Run applies Retention and the bounds at once, then every SweepInterval,
// until ctx ends.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("vision: could not sweep stored photos", "dir", s.cfg.Dir, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep reads what is stored from the disk and applies Retention and
// every bound to every device. Uploads wait for it: it holds the shelf
// while it lists the directory (a few milliseconds per thousand photos).
func (s *Service) Sweep(ctx context.Context) error {
	s.shelf.mu.Lock()
	defer s.shelf.mu.Unlock()
	devices, err := s.scan(ctx)
	if err != nil {
		return err
	}
	s.shelf.devices, s.shelf.photos, s.shelf.bytes = devices, 0, 0
	for _, d := range devices {
		s.shelf.photos += len(d.photos)
		s.shelf.bytes += d.bytes
	}
	dirs := make([]string, 0, len(devices))
	for dir := range devices {
		dirs = append(dirs, dir)
	}
	s.boundLocked("sweep", dirs...)
	return nil
}

// scan lists the photos under Dir: files whose name is a photo id and
// .json or an image extension. Anything else is left alone.
func (s *Service) scan(ctx context.Context) (map[string]*shelfDevice, error) {
	out := make(map[string]*shelfDevice)
	top, err := os.ReadDir(s.cfg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list photo directory: %w", err)
	}
	for _, de := range top {
		if !de.IsDir() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		entries, err := os.ReadDir(filepath.Join(s.cfg.Dir, de.Name()))
		if err != nil {
			return nil, fmt.Errorf("list photos: %w", err)
		}
		byID := make(map[string]*shelved)
		for _, e := range entries {
			id, ext := splitPhotoName(e.Name())
			if id == "" || !e.Type().IsRegular() {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue // deleted since listed
			}
			p := byID[id]
			if p == nil {
				taken, _ := time.Parse(photoIDTime, id[:len(photoIDTime)])
				p = &shelved{dir: de.Name(), id: id, taken: taken, mod: fi.ModTime()}
				byID[id] = p
			}
			p.bytes += fi.Size()
			if ext != ".json" {
				p.ext, p.mod = ext, fi.ModTime()
			}
		}
		if len(byID) == 0 {
			continue
		}
		d := &shelfDevice{}
		for _, p := range byID {
			d.photos = append(d.photos, p)
			d.bytes += p.bytes
		}
		slices.SortFunc(d.photos, older)
		out[de.Name()] = d
	}
	return out, nil
}

// splitPhotoName splits a stored file's name into a photo id and its
// extension; the id is "" for a file that is not a photo's.
func splitPhotoName(name string) (id, ext string) {
	ext = filepath.Ext(name)
	id = strings.TrimSuffix(name, ext)
	if !photoID.MatchString(id) {
		return "", ""
	}
	if ext == ".json" {
		return id, ext
	}
	for _, e := range exts {
		if e == ext {
			return id, ext
		}
	}
	return "", ""
}

// deletedTally is what one reason deleted in one bounding.
type deletedTally struct {
	photos int
	bytes  int64
}

// boundLocked deletes photos older than Retention, of any device, but
// those in use; then, oldest first, photos of dirs beyond MaxPerDevice and
// MaxDeviceBytes, and photos of any device beyond MaxTotalBytes, until the
// oldest is in use. The byte bounds keep a device's newest photo and the
// newest of all, however large. It logs one line per reason that deleted
// any.
func (s *Service) boundLocked(trigger string, dirs ...string) {
	tally := make(map[string]*deletedTally)
	del := func(d *shelfDevice, i int, reason string) {
		p := d.photos[i]
		d.photos = slices.Delete(d.photos, i, i+1)
		d.bytes -= p.bytes
		s.shelf.photos--
		s.shelf.bytes -= p.bytes
		if len(d.photos) == 0 {
			delete(s.shelf.devices, p.dir)
		}
		// Forgotten even when a file resists: a photo the gateway cannot
		// delete would otherwise be chosen again and again.
		if err := s.removeFiles(p); err != nil {
			s.log.Warn("vision: could not delete a photo", "photo", p.id, "dir", p.dir, "reason", reason, "error", err)
			return
		}
		s.deleted.WithLabelValues(reason).Inc()
		t := tally[reason]
		if t == nil {
			t = &deletedTally{}
			tally[reason] = t
		}
		t.photos++
		t.bytes += p.bytes
	}
	if s.cfg.Retention > 0 {
		cutoff := s.cfg.Now().Add(-s.cfg.Retention)
		for _, d := range s.shelf.devices {
			for i := 0; i < len(d.photos) && d.photos[i].taken.Before(cutoff); {
				if s.shelf.inUse[d.photos[i].key()] > 0 {
					i++
					continue
				}
				del(d, i, DeletedAge)
			}
		}
	}
	for _, dir := range dirs {
		for {
			d := s.shelf.devices[dir]
			if d == nil {
				break
			}
			reason := ""
			switch {
			case s.cfg.MaxPerDevice > 0 && len(d.photos) > s.cfg.MaxPerDevice:
				reason = DeletedDeviceCount
			case s.cfg.MaxDeviceBytes > 0 && d.bytes > s.cfg.MaxDeviceBytes && len(d.photos) > 1:
				// Never the device's newest photo: its metadata (question,
				// explanation) may take it past a bound of MaxBytes.
				reason = DeletedDeviceBytes
			}
			i := s.oldestFree(d)
			if reason == "" || i < 0 {
				break
			}
			del(d, i, reason)
		}
	}
	// Never the newest photo of all, likewise.
	for s.cfg.MaxTotalBytes > 0 && s.shelf.bytes > s.cfg.MaxTotalBytes && s.shelf.photos > 1 {
		var victim *shelfDevice
		for _, d := range s.shelf.devices {
			if victim == nil || older(d.photos[0], victim.photos[0]) < 0 {
				victim = d
			}
		}
		if victim == nil || s.oldestFree(victim) < 0 {
			break
		}
		del(victim, 0, DeletedTotalBytes)
	}
	for _, reason := range deleteReasons {
		if t := tally[reason]; t != nil {
			s.log.Info("vision: photos deleted", "reason", reason, "photos", t.photos, "bytes", t.bytes, "trigger", trigger)
		}
	}
}

// oldestFree is 0 when d's oldest photo is not in use, else -1: the
// bounds delete the oldest first, so a photo in use keeps the newer ones
// too until its upload ends (which applies them again), rather than have
// a newer one deleted before it.
func (s *Service) oldestFree(d *shelfDevice) int {
	if len(d.photos) == 0 || s.shelf.inUse[d.photos[0].key()] > 0 {
		return -1
	}
	return 0
}

// removeFiles deletes a photo's image and metadata; files already gone
// are no error.
func (s *Service) removeFiles(p *shelved) error {
	var errs []error
	names := []string{p.id + ".json"}
	if p.ext != "" {
		names = append(names, p.id+p.ext)
	}
	for _, name := range names {
		if err := os.Remove(filepath.Join(s.cfg.Dir, p.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
