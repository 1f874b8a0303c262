/* A stand-in for libnvidia-ml.so.1 (the entry points profile/telemetry_sources.cpp resolves), so that
 * the NVML path -- dlopen, the symbols, the handle by PCI bus id, the readings -- runs in CPU tests.
 * One GPU at bus id 0000:65:00.0 reporting a constant 300 W, whose energy counter starts at 5,000 J and
 * advances kJoulesPerRead (6 J: 300 W over a 20 ms sampling interval) at every read, so that what a
 * sampler sums is known exactly, whatever the time between its readings: a counter of wall time
 * differs from the sampler's timestamps by the time between the two clock reads (the thread
 * descheduled between them on a loaded machine). FAKE_NVML_NO_ENERGY=1: the energy
 * counter is not supported (a pre-Volta GPU), FAKE_NVML_INIT_FAILS=1: nvmlInit_v2 fails. */
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device* nvmlDevice_t;

enum { kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kNotSupported = 3, kNotFound = 6, kDriverNotLoaded = 9 };
static struct fake_device { int unused; } the_gpu;
static int initialised = 0;
static const unsigned long long kJoulesPerRead = 6;
static unsigned long long energy_reads = 0;

nvmlReturn_t nvmlInit_v2(void) {
  const char* fails = getenv("FAKE_NVML_INIT_FAILS");
  if (fails != NULL && strcmp(fails, "1") == 0) return kDriverNotLoaded;
  initialised = 1;
  energy_reads = 0;
  return kSuccess;
}

nvmlReturn_t nvmlShutdown(void) {
  initialised = 0;
  return kSuccess;
}

const char* nvmlErrorString(nvmlReturn_t status) {
  switch (status) {
    case kSuccess: return "Success";
    case kNotSupported: return "Not Supported";
    case kNotFound: return "Not Found";
    case kDriverNotLoaded: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* device) {
  if (!initialised) return kUninitialized;
  if (bus_id == NULL || strcmp(bus_id, "0000:65:00.0") != 0) return kNotFound;
  *device = &the_gpu;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long* energy_mj) {
  const char* none = getenv("FAKE_NVML_NO_ENERGY");
  if (none != NULL && strcmp(none, "1") == 0) return kNotSupported;
  if (device != &the_gpu) return kInvalidArgument;
  *energy_mj = (5000ULL + kJoulesPerRead * energy_reads++) * 1000ULL;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power_mw) {
  if (device != &the_gpu) return kInvalidArgument;
  *power_mw = 300000;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int* mhz) {
  if (device != &the_gpu) return kInvalidArgument;
  *mhz = type == 1 ? 1980 : type == 2 ? 2619 : 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensor, unsigned int* celsius) {
  if (device != &the_gpu || sensor != 0) return kInvalidArgument;
  *celsius = 61;
  return kSuccess;
}

/* SwPowerCap (0x4) | GpuIdle (0x1): throttled, by the power cap. */
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long* reasons) {
  if (device != &the_gpu) return kInvalidArgument;
  *reasons = 0x4 | 0x1;
  return kSuccess;
}
