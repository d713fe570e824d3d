//go:build cgo && !nohdf5

package packed

// #cgo LDFLAGS: -lhdf5
// #cgo linux,!arm64 CFLAGS: -I/usr/lib/x86_64-linux-gnu/hdf5/serial/include
// #cgo linux,!arm64 LDFLAGS: -L/usr/lib/x86_64-linux-gnu/hdf5/serial/
// #cgo linux,arm64 CFLAGS: -I/usr/lib/aarch64-linux-gnu/hdf5/serial/include
// #cgo linux,arm64 LDFLAGS: -L/usr/lib/aarch64-linux-gnu/hdf5/serial/
// #include <stdlib.h>
// #include "hdf5.h"
//
// // Whether a dataset's raw data lies in its own file: 1 yes, 0 no, -1 on
// // an error. External storage (H5Pset_external) and virtual datasets name
// // other files, which the library opens by name, anywhere on the host.
// static int dlfs_stored_inside(hid_t ds) {
// 	hid_t dcpl = H5Dget_create_plist(ds);
// 	if (dcpl < 0) return -1;
// 	int ok = 1;
// 	H5D_layout_t l = H5Pget_layout(dcpl);
// 	if (l < 0 || l == H5D_VIRTUAL) ok = 0;
// 	if (H5Pget_external_count(dcpl) != 0) ok = 0;
// 	H5Pclose(dcpl);
// 	return ok;
// }
//
// // The bytes of a dataset's whole dataspace in its own type: 1 and sets
// // *bytes, 0 when they do not fit in an hsize_t, -1 on an error.
// static int dlfs_data_bytes(hid_t ds, hsize_t *bytes) {
// 	hid_t sp = H5Dget_space(ds);
// 	if (sp < 0) return -1;
// 	hssize_t n = H5Sget_simple_extent_npoints(sp);
// 	H5Sclose(sp);
// 	hid_t t = H5Dget_type(ds);
// 	if (t < 0) return -1;
// 	size_t size = H5Tget_size(t);
// 	H5Tclose(t);
// 	if (n < 0 || size == 0 || (hsize_t)n > ((hsize_t)-1) / size) return 0;
// 	*bytes = (hsize_t)n * size;
// 	return 1;
// }
//
// // Whether a dataset's storage holds its whole dataspace: 1 yes, 0 no, -1
// // on an error. The library copies a compact dataset's data (kept in its
// // object header) for the whole dataspace without checking that the
// // header holds that much: a crafted file with a short one makes H5Dread
// // read past it and crash the process (found by FuzzHDF5Listing).
// // Contiguous and chunked data are read through the file, where the
// // library checks addresses against its end.
// static int dlfs_storage_sane(hid_t ds) {
// 	hid_t dcpl = H5Dget_create_plist(ds);
// 	if (dcpl < 0) return -1;
// 	H5D_layout_t l = H5Pget_layout(dcpl);
// 	H5Pclose(dcpl);
// 	if (l != H5D_COMPACT) return l < 0 ? -1 : 1;
// 	hsize_t bytes;
// 	int ok = dlfs_data_bytes(ds, &bytes);
// 	if (ok <= 0) return ok;
// 	return H5Dget_storage_size(ds) >= bytes;
// }
//
// // Where a dataset's elements lie in its file as they are, one after
// // another: contiguous storage, allocated, without filters, as long as
// // the whole dataspace. It returns 1 and sets *at to the data's absolute
// // offset (after any user block), 0 when the data is elsewhere (chunked
// // or compact storage, filters, contiguous storage not yet written, which
// // reads as the fill value), -1 on an error. The space status is asked
// // first: for unwritten storage H5Dget_offset (1.10) returns
// // HADDR_UNDEF plus the user block's size, a plausible offset.
// static int dlfs_contiguous_at(hid_t ds, unsigned long long *at) {
// 	hid_t dcpl = H5Dget_create_plist(ds);
// 	if (dcpl < 0) return -1;
// 	H5D_layout_t l = H5Pget_layout(dcpl);
// 	int nf = H5Pget_nfilters(dcpl);
// 	H5Pclose(dcpl);
// 	if (l < 0 || nf < 0) return -1;
// 	if (l != H5D_CONTIGUOUS || nf != 0) return 0;
// 	H5D_space_status_t st;
// 	if (H5Dget_space_status(ds, &st) < 0) return -1;
// 	if (st != H5D_SPACE_STATUS_ALLOCATED) return 0;
// 	hsize_t bytes;
// 	int ok = dlfs_data_bytes(ds, &bytes);
// 	if (ok <= 0) return ok;
// 	if (H5Dget_storage_size(ds) < bytes) return 0;
// 	haddr_t a = H5Dget_offset(ds);
// 	if (a == HADDR_UNDEF) return 0;
// 	*at = a;
// 	return 1;
// }
//
// // Whether the link name in group g is a hard link: 1 yes, 0 no (an
// // external or user-defined link, which points into another file; a soft
// // link, which may lead to one), -1 on an error.
// static int dlfs_hard_link(hid_t g, const char *name) {
// 	H5L_info_t info;
// 	if (H5Lget_info(g, name, &info, H5P_DEFAULT) < 0) return -1;
// 	return info.type == H5L_TYPE_HARD;
// }
import "C"

import (
	"unsafe"

	"gonum.org/v1/hdf5"
)

// storedInside reports whether ds's raw data lies in its own file.
func storedInside(ds *hdf5.Dataset) bool { return C.dlfs_stored_inside(C.hid_t(ds.ID())) == 1 }

// storageSane reports whether ds's storage holds its whole dataspace (see
// dlfs_storage_sane).
func storageSane(ds *hdf5.Dataset) bool { return C.dlfs_storage_sane(C.hid_t(ds.ID())) == 1 }

// contiguousAt returns the offset in its file of ds's elements when they
// lie there as they are, row after row (see dlfs_contiguous_at).
func contiguousAt(ds *hdf5.Dataset) (uint64, bool) {
	var at C.ulonglong
	if C.dlfs_contiguous_at(C.hid_t(ds.ID()), &at) != 1 {
		return 0, false
	}
	return uint64(at), true
}

// hardLink reports whether name in g is a hard link, whose object lies in
// g's file.
func hardLink(g hdf5.CommonFG, name string) bool {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.dlfs_hard_link(C.hid_t(g.ID()), cs) == 1
}
