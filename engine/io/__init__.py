"""The ground floor: drives, buffers, dispatch and page-cache-bypassing reads. Imports no other engine part."""
