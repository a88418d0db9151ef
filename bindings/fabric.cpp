// activekv._fabric: the C++ boundary of the GPU runtime.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings/common.h"
#include "fabric/arena_plan.h"

namespace nb = nanobind;
using activekv::fabric::ArenaPlan;

NB_MODULE(_fabric, m) {
  m.doc() = "Fabric boundary: sealed arena, stream rules and decode step of a GPU runtime.";
  activekv::bindings::bind_build_and_device(m);

  nb::exception<activekv::fabric::ArenaSealedError>(m, "ArenaSealedError", PyExc_RuntimeError);

  nb::class_<ArenaPlan>(m, "ArenaPlan",
                        "Reservations of the device arena; refused and counted after seal().")
      .def(nb::init<>())
      .def("reserve", &ArenaPlan::reserve, nb::arg("name"), nb::arg("bytes"),
           nb::arg("alignment") = 256, "Reserves bytes at an aligned offset; returns the offset.")
      .def("seal", &ArenaPlan::seal, "Ends warm-up: later reservations raise ArenaSealedError.")
      .def_prop_ro("sealed", &ArenaPlan::sealed)
      .def_prop_ro("total_bytes", &ArenaPlan::total_bytes)
      .def_prop_ro("refused_after_seal", &ArenaPlan::refused_after_seal);
}
