// Package data loads labelled image datasets, applies torchvision-style
// transforms from a JSON data config, splits each epoch between ranks and
// delivers batches as contiguous float32 NCHW buffers.
//
// It reads MNIST-style IDX files (gzipped or raw), folders of class folders
// of PNG and JPEG images (torchvision's ImageFolder) and CSV files in
// label,pixel1,…,pixelN layout. Images stay uint8 in memory and become
// float32 only in the batch.
//
// Two other kinds of sample share the loader, the sampler and the epoch:
// text (a TextSpec's files concatenated as bytes, 90% to train and 10% to
// validate, each sample a window of context+1 bytes, Split.SetContext)
// for language models, and tables (a CSV of numbers whose target columns,
// Config.Targets, are float targets: ReadTable) for regression and binary
// losses, each batch row the features and then the targets.
//
// # Usage
//
//	cfg, err := data.LoadConfig("data.json")
//	train, err := cfg.Load("train")            // checked: every sample has one shape
//	fmt.Println(train.Describe())               // transforms, classes, counts
//	l := &data.Loader{Split: train, BatchSize: 64, Seed: seed,
//		Sampler: data.Sampler{N: train.Len(), World: n, Rank: r, Seed: seed, Shuffle: true}}
//	e, err := l.Epoch(ctx, epoch)
//	defer e.Close()
//	err = e.Each(func(b *data.Batch) error { ...; return nil }) // nil at the end of the epoch
//
// Random transforms draw from (seed, epoch, dataset index), so a run repeats
// exactly and a sample's augmentation does not depend on the world size.
//
// # Served datasets
//
// A dataset other peers serve is named by its Manifest's ID: the SHA-256
// of a manifest that holds the transforms, the class names and every
// sample's shape, label and SHA-256. NewManifest makes one for serving;
// ReadManifest reads one off a stream, bounded and checked against the ID
// asked for before anything of it is used (ParseManifest, the same for
// bytes in hand). On the
// training peer, Manifest.Remote makes a Split whose samples a Fetcher
// (p2p.DataClient) brings as each epoch needs them, request_size at a
// time and ahead of the loader, optionally kept in a cache file checked
// against the manifest when it is read back:
//
//	s, err := m.Remote("train", client, data.RemoteConfig{RequestSize: 256, CacheDir: dir})
//	defer s.Close()
//	l := &data.Loader{Split: s, ...} // as with local files; batches are the same
package data
