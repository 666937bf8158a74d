# Installation for projects that build against libwbclient: the headers, the
# shared and the static library, a pkg-config file (wbclient.pc) and a CMake
# package (find_package(wbclient) -> wbclient::wbclient, and
# wbclient::wbclient_static); plus the man pages, the shell completion and the
# deployment examples.
# The programs install themselves (broker/ and client/CMakeLists.txt).
#
# Both files are relocatable: they find the prefix from their own location,
# so `cmake --install BUILD --prefix ANYWHERE` gives a working tree.

include(CMakePackageConfigHelpers)

set(WB_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/wbclient)

if(TARGET wbclient AND TARGET wbclient_static)
  # The in-tree static library holds only the client's own objects (the tests
  # link wbcommon beside it). The installed one must stand alone, so it is a
  # separate archive of the client's, wbrpc's, wbcommon's and the generated
  # protocol code's objects, built beside it under the same file name.
  add_library(wbclient_archive STATIC
    $<TARGET_OBJECTS:wbclient_static> $<TARGET_OBJECTS:wbrpc> $<TARGET_OBJECTS:wbcommon>
    $<TARGET_OBJECTS:wbproto>)
  set_target_properties(wbclient_archive PROPERTIES
    OUTPUT_NAME wbclient
    EXPORT_NAME wbclient_static
    ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/install-archive)
  target_include_directories(wbclient_archive INTERFACE
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

  install(TARGETS wbclient_archive EXPORT wbclientTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT wbclientTargets NAMESPACE wbclient:: DESTINATION ${WB_CMAKE_PACKAGE_DIR})

  # What a static link needs besides the archive, for both files: the
  # pkg-config modules of the third-party libraries the archive's parts link
  # (read from the targets, so that a new dependency is not forgotten), and
  # the CUDA runtime when the cuda backend is built.
  set(WB_PC_MODULE_OF_ZMQ libzmq)
  set(WB_PC_MODULE_OF_PROTOBUFC libprotobuf-c)
  set(WB_PC_MODULE_OF_JANSSON jansson)
  set(WB_PC_MODULE_OF_XXHASH libxxhash)
  set(WB_PC_MODULE_OF_LIBZIP libzip)
  set(WB_PC_MODULES)
  set(WB_PACKAGE_CUDA_DIR "")
  foreach(part wbclient_static wbrpc wbcommon wbproto)
    get_target_property(links ${part} LINK_LIBRARIES)
    foreach(lib IN LISTS links)
      if(lib MATCHES "^PkgConfig::(.+)$")
        if(DEFINED WB_PC_MODULE_OF_${CMAKE_MATCH_1})
          list(APPEND WB_PC_MODULES ${WB_PC_MODULE_OF_${CMAKE_MATCH_1}})
        else()
          message(WARNING "cmake/WbInstall.cmake: ${part} links ${lib}; name its pkg-config "
                          "module here so that static users of libwbclient get it")
        endif()
      elseif(lib STREQUAL "CUDA::cudart")
        set(WB_PACKAGE_CUDA_DIR "${CUDAToolkit_LIBRARY_DIR}")
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES WB_PC_MODULES)
  list(JOIN WB_PC_MODULES " " WB_PC_REQUIRES_PRIVATE)
  # wbclient.pc names their libraries in Libs.private rather than the modules
  # in Requires.private: on Debian 12, `pkg-config --static` through libzmq
  # reaches norm.pc, whose Libs.private names a bare "libprotokit.a" that no
  # link can find. A static libwbclient links the shared libzmq just fine.
  execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --libs ${WB_PC_MODULES}
    OUTPUT_VARIABLE WB_PC_DEP_LIBS OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE pc_rc)
  if(NOT pc_rc EQUAL 0)
    message(WARNING "pkg-config --libs ${WB_PC_MODULES} failed; wbclient.pc lacks them")
    set(WB_PC_DEP_LIBS "")
  endif()
  set(WB_PC_LIBS_PRIVATE "${WB_PC_DEP_LIBS} -lpthread")
  if(CMAKE_DL_LIBS)
    string(APPEND WB_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
  endif()
  if(WB_PACKAGE_CUDA_DIR)
    string(APPEND WB_PC_LIBS_PRIVATE " -L${WB_PACKAGE_CUDA_DIR} -lcudart")
  endif()

  # wbclient.pc: the prefix is found from the file's own directory.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(WB_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  else()
    file(RELATIVE_PATH WB_PC_UP "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
    string(REGEX REPLACE "/$" "" WB_PC_UP "${WB_PC_UP}")
    set(WB_PC_PREFIX "\${pcfiledir}/${WB_PC_UP}")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/client/wbclient.pc.in
    ${CMAKE_CURRENT_BINARY_DIR}/wbclient.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/wbclient.pc
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/wbclientConfig.cmake.in
    ${CMAKE_CURRENT_BINARY_DIR}/wbclientConfig.cmake
    INSTALL_DESTINATION ${WB_CMAKE_PACKAGE_DIR})
  # 0.x releases may break their interface at every minor version.
  write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/wbclientConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/wbclientConfig.cmake
    ${CMAKE_CURRENT_BINARY_DIR}/wbclientConfigVersion.cmake
    DESTINATION ${WB_CMAKE_PACKAGE_DIR})
endif()

# The example worker, which the Kubernetes manifests run: it finds the
# installed libwbclient.so relative to itself, wherever the prefix is.
if(TARGET wb-demo-worker)
  set_target_properties(wb-demo-worker PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS wb-demo-worker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Man pages: wbrokerd(8) and wbctl(1).
foreach(page wbrokerd.8 wbctl.1)
  if(EXISTS ${PROJECT_SOURCE_DIR}/docs/man/${page})
    string(REGEX REPLACE ".*\\." "" section ${page})
    install(FILES ${PROJECT_SOURCE_DIR}/docs/man/${page}
      DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
  endif()
endforeach()

# Shell completion for both programs, where bash-completion and zsh look
# for it: bash loads completions/NAME when NAME is first completed, zsh reads
# vendor-completions/_NAME through its fpath.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/completion/wbctl.bash
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME wbctl)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/completion/wbrokerd.bash
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME wbrokerd)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/completion/_wbctl ${PROJECT_SOURCE_DIR}/deploy/completion/_wbrokerd
  DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions)

# The deployment files are examples to adapt (paths, users, images), so they
# go with the documentation rather than into /etc or the systemd directories.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/wbroker.conf ${PROJECT_SOURCE_DIR}/deploy/wbrokerd.service
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/kubernetes
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
